"""Remote rollout (`cluster.placement: remote`): replicas serving an engine over an authenticated
TCP channel (`server.py`, `replica.py`), and the trainer's client of them (`client.py`)."""
