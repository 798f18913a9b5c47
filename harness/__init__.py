"""Helpers shared by the test suite (tests/) and the benchmarks (benchmarks/, scripts/bench).

Neither imports the other: both import from here. Not part of the installed
package (pyproject.toml installs authsvc* only); pytest and scripts/bench find
it because the repository's root is on sys.path.
"""
