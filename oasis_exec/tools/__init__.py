"""Tools around the executor; the serving path never imports them: ``bench.py``, ``recorder.py`` (bench results as
recordings), ``quality/``, ``draft_train.py``, ``rpf_split.py`` (the prefill/decode split study), ``cli_checks.py``."""
