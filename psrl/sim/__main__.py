"""``python -m psrl.sim``: see ``psrl.sim.cli``."""

from psrl.sim.cli import main

if __name__ == "__main__":
    main()
