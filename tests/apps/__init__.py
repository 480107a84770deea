"""Small apps the tests run as workers (``-A tests.apps.NAME:app``), each for one
scenario; the reference apps are in ``agents/``."""
