"""Demos of loadspec on the repository's fixtures, run from a checkout (not installed).

``python -m demos.train_resume`` (``make demo``) and ``python -m demos.mixture`` (``make demo-mix``). Why a folder of
its own: a training job ``import impl`` s the library, and a demo is neither library nor test. The wheel ships
``reference``, ``impl`` and ``conformance`` only (pyproject.toml's ``packages.find``), so neither ``demos`` nor the
``fixtures`` it imports is installed beside a user's own packages.
"""
