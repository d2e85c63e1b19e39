"""The application file that `bergstream deploy spark-submit` hands to spark-submit.

spark-submit runs a Python file, not a module: this one runs the `bergstream` command line with the
arguments that follow it (`router run --topic ...`), in the driver that spark-submit started.
"""

from bergstream.cli import main

if __name__ == "__main__":
    main()
