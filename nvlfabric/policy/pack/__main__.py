"""nvlfabric's policy pack (the rules are nvlfabric.policy.rules)."""

from pulumi_policy import (
    EnforcementLevel,
    PolicyPack,
    ReportViolation,
    ResourceValidationArgs,
    ResourceValidationPolicy,
    StackValidationArgs,
    StackValidationPolicy,
)

from nvlfabric.policy import rules


def _resource_rule(rule):  # type: ignore[no-untyped-def]
    def validate(args: ResourceValidationArgs, report_violation: ReportViolation) -> None:
        problem = rule(args.resource_type, args.props)
        if problem:
            report_violation(problem)

    return validate


def _channels(args: StackValidationArgs, report_violation: ReportViolation) -> None:
    problem = rules.channel_shortfall((r.resource_type, r.props) for r in args.resources)
    if problem:
        report_violation(problem)


PolicyPack(
    name="nvlfabric",
    enforcement_level=EnforcementLevel.MANDATORY,
    policies=[
        ResourceValidationPolicy(name="bound-workloads-request-gpus", description=rules.__doc__.split("\n- ")[1],
                                 validate=_resource_rule(rules.bound_workload_without_gpus)),
        ResourceValidationPolicy(name="no-force-delete", description=rules.__doc__.split("\n- ")[2],
                                 validate=_resource_rule(rules.force_deleted_domain)),
        StackValidationPolicy(name="channels-within-the-driver", description=rules.__doc__.split("\n- ")[3].split(
            "\n\n")[0], validate=_channels),
    ],
)
