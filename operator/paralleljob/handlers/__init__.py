"""kopf wiring of the operator: thin handlers over pure policies, the planner, manifests and `paralleljob.k8s`.

`registry` registers the kopf handlers (importing it is what `paralleljob operator` does); `reconcile`
decides and acts for one job from the cluster's state; `gang`, `conditions` and `placement` are the
pure policies it consults; `coalescer` runs at most one reconcile per job at a time; `metrics` exports Prometheus
figures.
"""
