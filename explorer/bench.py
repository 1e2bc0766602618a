"""python -m explorer.bench ...: the command line of explorer.cli."""

from .cli import main

if __name__ == "__main__":
    main()
