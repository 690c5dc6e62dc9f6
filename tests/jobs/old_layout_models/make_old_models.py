"""Save one model per task whose registered model pickles a class outside jobs/layers, with the pre-move layout."""

import sys

import mlflow.pytorch
import torch

from jobs.registry import get_task

out = sys.argv[1]
cases = {
    "tversky.xor": {},
    "tversky.xor_grid": {},
    "sna.lorenz": {},
    "symbolic.prop": {},
}
for name, params in cases.items():
    task = get_task(name)
    cfg = task.make_config(params)
    torch.manual_seed(0)
    model = task.build_model(cfg).eval()
    x = task.example_input(cfg)
    with torch.no_grad():
        y = model(x)
    d = f"{out}/{name.replace('.', '_')}"
    mlflow.pytorch.save_model(model, d, serialization_format="pickle")
    torch.save({"input": x, "output": y}, f"{d}/example.pt")
    print(name, type(model).__module__, type(model).__name__, tuple(x.shape))
