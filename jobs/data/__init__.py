"""Data sets for the tasks: one loader module per kind (`images.py`, `text.py`), the errors they raise
(`errors.py`) and per-rank sharding (`sharding.py`). A download is only attempted when a config asks for one."""
