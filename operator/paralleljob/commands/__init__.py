"""The subcommands of `paralleljob`, one module each; every module has `register(subparsers)`.

A subcommand parses its arguments, calls the pure layers, prints, and returns an exit code.
"""

from paralleljob.commands import cluster, crd, data, docs, export, model_spec, operator, plan, run, validate

SUBCOMMANDS = (validate, plan, run, cluster, operator, crd, docs, export, data, model_spec)
