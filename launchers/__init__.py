"""mlaunch: a launcher adapter for distributed training on ModelArts-style platforms.

The package is named ``launchers`` (the distribution and the command are ``mlaunch``).
Importing it must stay cheap: the supervisor runs on every node's critical start-up path,
so nothing heavy (torch, jinja2, paramiko) is imported here.
"""

__version__ = "0.1.0"
