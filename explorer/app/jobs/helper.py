"""A warm-up helper's process: python -m explorer.app.jobs.helper TASK... (jobs.warm.start_helpers starts it)."""

import sys

from .warm import helper_main

if __name__ == "__main__":
    helper_main(sys.argv[1:])
