"""Reviewing a change before it is made: what a `pulumi preview` of nvlfabric's components will do
to the cluster, as a short Markdown report for a pull request (`nvlfabric preview-report`)."""
