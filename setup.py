"""Only the package list lives here; everything else is in pyproject.toml.

pyproject's ``packages.find`` cannot also name ``svconsole_scripts`` (scripts/ under another
name), so the list is found here: every package under console/ and screens/, plus
svconsole_scripts. A new subpackage is shipped without anyone editing a list."""

from setuptools import find_packages, setup

setup(packages=find_packages(include=["console", "console.*", "screens", "screens.*"])
      + ["svconsole_scripts"])
