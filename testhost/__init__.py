"""A throwaway k3s-style test host: systemd-nspawn + a real Kubernetes control plane.

See testhost/README.md for what it builds, where it caches, and how it is used.
"""
