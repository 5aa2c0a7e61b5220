"""paralleljob: a Kubernetes operator for multi-node 3D-parallel DeepSpeed training."""

from importlib import metadata

try:
    __version__ = metadata.version("paralleljob")
except metadata.PackageNotFoundError:  # running from a source tree without installing
    __version__ = "0.0.0"
