"""`python -m openrelay.simulator`: runs the command line (`openrelay.simulator.cli.main`)."""

import sys

from openrelay.simulator.cli import main

if __name__ == "__main__":
    main(sys.argv[1:])
