"""nvlfabric's Pulumi policy pack: rules a platform team enforces at `pulumi preview`.

    pulumi preview --policy-pack "$(nvlfabric policy-pack)"

The rules are plain functions over a resource's type and properties (`rules.py`, unit-tested);
`pack/__main__.py` registers them with `pulumi_policy` (the `nvlfabric[policy]` extra).
"""
