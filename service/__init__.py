"""layerlab control plane: sweep specs, the queue store, the HTTP API and the CLI.

Nothing in this package imports torch or Ray at module import time: the API must start fast.
"""
