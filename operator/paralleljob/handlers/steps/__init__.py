"""The steps of one reconcile pass (`handlers.reconcile` runs them in order), one module each. They share the
`Pass` and its writes (`handlers.passes`), never each other's helpers.
"""
