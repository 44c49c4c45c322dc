"""cnpa-op's TeamSpace controller: `python3 -m cnpa_controller` (long-running, list+watch) and
`python3 -m cnpa_controller --once` (one pass from a fresh list: what reconcile.sh runs).

Watch-fed caches of TeamSpaces, their namespaces and quotas (cache.py) queue the names of the
TeamSpaces whose objects changed (workqueue.py); workers reconcile each with the plan
(plan.py: one pure function decides what to write) and send its writes (executor.py);
controller.py wires them, once.py makes one pass; config.py holds every setting and its
default, __main__.py is the command line. Every request and watch goes through api.py, on the
connection kubeconfig.py's reading of the kubeconfig describes.
"""

from .api import Api, ApiError, path_of

# The collection's version (galaxy.yml): the package is installed from it, never on its own.
__version__ = "2.0.0"

__all__ = ["Api", "ApiError", "__version__", "path_of"]
