"""Our wire models against the newest E2B SDK's generated ones: every field a request of the
SDK can carry is one our model knows, and every SDK model is accounted for, so the next
SDK release's new field or model fails here instead of reaching users as a 400."""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import re

import e2b.api.client.models as sdk_models
import pytest
from pydantic import BaseModel

from agentenv.api import builds, models, secrets, templatetags

# SDK request body -> our model of it.
REQUESTS: dict[str, type[BaseModel]] = {
    "NewSandbox": models.NewSandbox,
    "NewSandboxV2": models.NewSandbox,
    "SandboxNetworkConfig": models.SandboxNetwork,
    "SandboxNetworkUpdateConfig": models.NetworkUpdate,
    "SandboxEgressProxyConfigType0": models.EgressProxy,
    "SandboxEgressProxyTLSConfigType0": models.EgressProxyTls,
    "SandboxNetworkRule": models.NetworkRule,
    "SandboxNetworkTransform": models.HeaderTransform,
    "SandboxAutoResumeConfig": models.AutoResume,
    "SandboxVolumeMount": models.VolumeMount,
    "ConnectSandbox": models.ConnectBody,
    "ConnectSandboxV2": models.ConnectBody,
    "ResumedSandbox": models.ResumeBody,
    "SandboxPauseRequest": models.PauseBody,
    "SandboxSnapshotRequest": models.SnapshotBody,
    "SandboxForkRequest": models.ForkBody,
    "SandboxTimeoutRequest": models.TimeoutBody,
    "SandboxRefreshRequest": models.RefreshBody,
    "NewVolume": models.NewVolume,
    "TemplateBuildRequestV3": builds.TemplateBuildRequest,
    "TemplateBuildStartV2": builds.BuildStart,
    "GeneralRegistry": builds.GeneralRegistry,
    "AWSRegistry": builds.AwsRegistry,
    "GCPRegistry": builds.GcpRegistry,
    "AssignTemplateTagsRequest": templatetags.AssignTags,
    "DeleteTemplateTagsRequest": templatetags.DeleteTags,
    "SandboxIam": models.SandboxIam,
    "SandboxIamToken": models.IamToken,
    "NewSecret": secrets.NewSecret,
    "SecretUpdate": secrets.SecretUpdate,
}

# Maps of free keys (their values are checked by the model holding them), answers
# the SDK reads (it ignores fields it does not know, and ours carry E2B's), and request
# bodies not served yet, each with the reason.
NOT_REQUESTS = {
    # Free-form maps.
    "McpType0", "SandboxNetworkConfigRules", "SandboxNetworkUpdateConfigRules",
    "SandboxNetworkTransformHeaders", "SandboxIamTokens", "SecretMetadata",
    "TemplateBuildFileUploadHeaders", "SandboxLogEntryFields",
    # Answers.
    "AssignedTemplateTags", "BuildLogEntry", "BuildStatusReason", "Error", "ListedSandbox",
    "Sandbox", "SandboxDetail", "SandboxForkResult", "SandboxLifecycle", "SandboxLog",
    "SandboxLogEntry", "SandboxLogs", "SandboxLogsV2Response", "SandboxMetric",
    "SandboxesWithMetrics", "SnapshotInfo", "Template", "TemplateAliasResponse",
    "TemplateBuild", "TemplateBuildFileUpload", "TemplateBuildInfo",
    "TemplateBuildLogsResponse", "TemplateRequestResponseV3", "TemplateStep", "TemplateTag",
    "TemplateTagAssignment", "TemplateTagAssignmentsResponse", "TemplateTagExistsResponse",
    "TemplateTagGroup", "TemplateTagGroupsResponse", "TemplateTagsCountResponse",
    "TemplateUpdateResponse", "TemplateWithBuilds", "TeamUser", "Volume", "VolumeAndToken",
    "Secret",
    # The answer of `GET /unstable/sandboxes/{id}/record`, which no SDK call reads.
    "SandboxRecord",
    # Bodies of routes other engineers are adding (issue 24): template publishing. Each
    # moves to REQUESTS with its route.
    "TemplateUpdateRequest",
}  # fmt: skip


def _sdk_classes() -> dict[str, type]:
    found = {}
    for module in pkgutil.iter_modules(sdk_models.__path__):
        loaded = importlib.import_module(f"{sdk_models.__name__}.{module.name}")
        for name, cls in inspect.getmembers(loaded, inspect.isclass):
            if cls.__module__ == loaded.__name__ and hasattr(cls, "to_dict"):
                found[name] = cls
    return found


def _wire_fields(sdk_class: type) -> set[str]:
    """The JSON keys the SDK's model writes (its `to_dict`, as the generator emits it)."""
    source = inspect.getsource(sdk_class.to_dict)  # type: ignore[attr-defined]
    return set(re.findall(r'field_dict\["(\w+)"\]', source)) | set(
        re.findall(r'^\s+"(\w+)": \w+,$', source, re.MULTILINE)
    )


SDK_CLASSES = _sdk_classes()


def test_every_sdk_model_is_accounted_for() -> None:
    unknown = set(SDK_CLASSES) - set(REQUESTS) - NOT_REQUESTS
    assert not unknown, f"the SDK has models this server does not know: {sorted(unknown)}"
    gone = (set(REQUESTS) | NOT_REQUESTS) - set(SDK_CLASSES)
    assert not gone, f"listed here, not in the SDK: {sorted(gone)}"


@pytest.mark.parametrize("sdk_name", sorted(REQUESTS))
def test_our_model_knows_every_field_the_sdk_sends(sdk_name: str) -> None:
    ours = REQUESTS[sdk_name]
    known = {field.alias or name for name, field in ours.model_fields.items()}
    missing = _wire_fields(SDK_CLASSES[sdk_name]) - known
    assert not missing, f"{ours.__name__} lacks {sorted(missing)} of the SDK's {sdk_name}"
