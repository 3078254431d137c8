"""The test suite as one package, so every test imports its shared modules one way: `from tests.helpers import ...`,
`from tests import sglang_cpu`, `from tests.doubles.sglang_standin import ...` (and bench/, scripts/ the same way:
`from bench import _numa`). pyproject.toml's `[tool.pytest.ini_options] pythonpath = ["."]` puts the repository root
on sys.path for pytest however it is started; a subprocess a test launches gets it through PYTHONPATH. A package
(not a namespace directory) so that a stray top-level `tests` package some installed wheel ships cannot shadow it."""
