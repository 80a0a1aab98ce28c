"""`python -m openrelay.cli`: the same entry point as the `orl` console script."""

from openrelay.cli.app import main

if __name__ == "__main__":
    main()
