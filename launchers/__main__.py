"""``python -m launchers`` is the same as the ``mlaunch`` command."""

from launchers.cli.main import main

if __name__ == "__main__":
    main()
