"""``python -m oasis_exec quality ...``: selection quality and end-to-end quality of the sparse modes on a real model.

- ``quality selection``: lookahead agreement per draft, current-query proxy, recall of the true top-K, attention
  mass, step-to-step and cross-head overlap (``selection.py``);
- ``quality e2e``: perplexity, greedy agreement with dense and passkey accuracy per mode and fetch ratio through the
  engine (``endtoend.py``).

Each subcommand registers itself in ``cli.py``; results go to ``experiments/<question>/results/`` as JSON with the device, date,
commit, weights and selection source.
"""
