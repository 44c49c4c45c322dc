"""The benchmark (docs/benchmark.md): `python bench/run.py --help`, with the project's
virtualenv (it imports bench.host, cnpa_controller and testhost as that virtualenv installs
them: dev.py's link_checkout)."""
