"""layerlab science: layers (plain torch modules) and tasks (train loops).

Nothing here imports the service, the workers, Ray or MLflow, so a registered model that bundles
this package loads in an environment that has only torch.
"""

from jobs import moved

moved.install()  # models pickled before jobs/ had family folders still find their classes (jobs/moved.py)
