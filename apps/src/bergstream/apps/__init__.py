"""The yardstick applications: streaming jobs written against named sources, run live and as backfills.

Each module has one function that takes the run's `AppRun` (`bergstream.runtime.app`) and returns the
streaming DataFrame the application writes; `bergstream app run` and `bergstream backfill run` start it.
"""
