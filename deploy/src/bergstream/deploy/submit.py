"""The application file that `bergstream deploy spark-submit` hands to spark-submit.

spark-submit runs a Python file, not a module: this one runs the `bergstream` command line (as
`python -m bergstream` does) with the arguments that follow it (`router run --topic ...`), in the driver that
spark-submit started.
"""

import runpy

if __name__ == "__main__":
    runpy.run_module("bergstream", run_name="__main__", alter_sys=True)
