from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class CgroupDriver(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    SYSTEMD: _ClassVar[CgroupDriver]
    CGROUPFS: _ClassVar[CgroupDriver]

class NamespaceMode(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    POD: _ClassVar[NamespaceMode]
    CONTAINER: _ClassVar[NamespaceMode]
    NODE: _ClassVar[NamespaceMode]
    TARGET: _ClassVar[NamespaceMode]

class PodSandboxState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    SANDBOX_READY: _ClassVar[PodSandboxState]
    SANDBOX_NOTREADY: _ClassVar[PodSandboxState]

class ContainerState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    CONTAINER_CREATED: _ClassVar[ContainerState]
    CONTAINER_RUNNING: _ClassVar[ContainerState]
    CONTAINER_EXITED: _ClassVar[ContainerState]
    CONTAINER_UNKNOWN: _ClassVar[ContainerState]
SYSTEMD: CgroupDriver
CGROUPFS: CgroupDriver
POD: NamespaceMode
CONTAINER: NamespaceMode
NODE: NamespaceMode
TARGET: NamespaceMode
SANDBOX_READY: PodSandboxState
SANDBOX_NOTREADY: PodSandboxState
CONTAINER_CREATED: ContainerState
CONTAINER_RUNNING: ContainerState
CONTAINER_EXITED: ContainerState
CONTAINER_UNKNOWN: ContainerState

class VersionRequest(_message.Message):
    __slots__ = ("version",)
    VERSION_FIELD_NUMBER: _ClassVar[int]
    version: str
    def __init__(self, version: _Optional[str] = ...) -> None: ...

class VersionResponse(_message.Message):
    __slots__ = ("version", "runtime_name", "runtime_version", "runtime_api_version")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    RUNTIME_NAME_FIELD_NUMBER: _ClassVar[int]
    RUNTIME_VERSION_FIELD_NUMBER: _ClassVar[int]
    RUNTIME_API_VERSION_FIELD_NUMBER: _ClassVar[int]
    version: str
    runtime_name: str
    runtime_version: str
    runtime_api_version: str
    def __init__(self, version: _Optional[str] = ..., runtime_name: _Optional[str] = ..., runtime_version: _Optional[str] = ..., runtime_api_version: _Optional[str] = ...) -> None: ...

class StatusRequest(_message.Message):
    __slots__ = ("verbose",)
    VERBOSE_FIELD_NUMBER: _ClassVar[int]
    verbose: bool
    def __init__(self, verbose: _Optional[bool] = ...) -> None: ...

class RuntimeCondition(_message.Message):
    __slots__ = ("type", "status", "reason", "message")
    TYPE_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    type: str
    status: bool
    reason: str
    message: str
    def __init__(self, type: _Optional[str] = ..., status: _Optional[bool] = ..., reason: _Optional[str] = ..., message: _Optional[str] = ...) -> None: ...

class RuntimeStatus(_message.Message):
    __slots__ = ("conditions",)
    CONDITIONS_FIELD_NUMBER: _ClassVar[int]
    conditions: _containers.RepeatedCompositeFieldContainer[RuntimeCondition]
    def __init__(self, conditions: _Optional[_Iterable[_Union[RuntimeCondition, _Mapping]]] = ...) -> None: ...

class RuntimeHandlerFeatures(_message.Message):
    __slots__ = ("recursive_read_only_mounts", "user_namespaces")
    RECURSIVE_READ_ONLY_MOUNTS_FIELD_NUMBER: _ClassVar[int]
    USER_NAMESPACES_FIELD_NUMBER: _ClassVar[int]
    recursive_read_only_mounts: bool
    user_namespaces: bool
    def __init__(self, recursive_read_only_mounts: _Optional[bool] = ..., user_namespaces: _Optional[bool] = ...) -> None: ...

class RuntimeHandler(_message.Message):
    __slots__ = ("name", "features")
    NAME_FIELD_NUMBER: _ClassVar[int]
    FEATURES_FIELD_NUMBER: _ClassVar[int]
    name: str
    features: RuntimeHandlerFeatures
    def __init__(self, name: _Optional[str] = ..., features: _Optional[_Union[RuntimeHandlerFeatures, _Mapping]] = ...) -> None: ...

class RuntimeFeatures(_message.Message):
    __slots__ = ("supplemental_groups_policy", "user_namespaces_host_network", "mount_options")
    SUPPLEMENTAL_GROUPS_POLICY_FIELD_NUMBER: _ClassVar[int]
    USER_NAMESPACES_HOST_NETWORK_FIELD_NUMBER: _ClassVar[int]
    MOUNT_OPTIONS_FIELD_NUMBER: _ClassVar[int]
    supplemental_groups_policy: bool
    user_namespaces_host_network: bool
    mount_options: bool
    def __init__(self, supplemental_groups_policy: _Optional[bool] = ..., user_namespaces_host_network: _Optional[bool] = ..., mount_options: _Optional[bool] = ...) -> None: ...

class StatusResponse(_message.Message):
    __slots__ = ("status", "info", "runtime_handlers", "features")
    class InfoEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    STATUS_FIELD_NUMBER: _ClassVar[int]
    INFO_FIELD_NUMBER: _ClassVar[int]
    RUNTIME_HANDLERS_FIELD_NUMBER: _ClassVar[int]
    FEATURES_FIELD_NUMBER: _ClassVar[int]
    status: RuntimeStatus
    info: _containers.ScalarMap[str, str]
    runtime_handlers: _containers.RepeatedCompositeFieldContainer[RuntimeHandler]
    features: RuntimeFeatures
    def __init__(self, status: _Optional[_Union[RuntimeStatus, _Mapping]] = ..., info: _Optional[_Mapping[str, str]] = ..., runtime_handlers: _Optional[_Iterable[_Union[RuntimeHandler, _Mapping]]] = ..., features: _Optional[_Union[RuntimeFeatures, _Mapping]] = ...) -> None: ...

class RuntimeConfigRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class LinuxRuntimeConfiguration(_message.Message):
    __slots__ = ("cgroup_driver",)
    CGROUP_DRIVER_FIELD_NUMBER: _ClassVar[int]
    cgroup_driver: CgroupDriver
    def __init__(self, cgroup_driver: _Optional[_Union[CgroupDriver, str]] = ...) -> None: ...

class RuntimeConfigResponse(_message.Message):
    __slots__ = ("linux",)
    LINUX_FIELD_NUMBER: _ClassVar[int]
    linux: LinuxRuntimeConfiguration
    def __init__(self, linux: _Optional[_Union[LinuxRuntimeConfiguration, _Mapping]] = ...) -> None: ...

class UpdateRuntimeConfigRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class UpdateRuntimeConfigResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class PodSandboxMetadata(_message.Message):
    __slots__ = ("name", "uid", "namespace", "attempt")
    NAME_FIELD_NUMBER: _ClassVar[int]
    UID_FIELD_NUMBER: _ClassVar[int]
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    name: str
    uid: str
    namespace: str
    attempt: int
    def __init__(self, name: _Optional[str] = ..., uid: _Optional[str] = ..., namespace: _Optional[str] = ..., attempt: _Optional[int] = ...) -> None: ...

class NamespaceOption(_message.Message):
    __slots__ = ("network", "pid", "ipc", "target_id")
    NETWORK_FIELD_NUMBER: _ClassVar[int]
    PID_FIELD_NUMBER: _ClassVar[int]
    IPC_FIELD_NUMBER: _ClassVar[int]
    TARGET_ID_FIELD_NUMBER: _ClassVar[int]
    network: NamespaceMode
    pid: NamespaceMode
    ipc: NamespaceMode
    target_id: str
    def __init__(self, network: _Optional[_Union[NamespaceMode, str]] = ..., pid: _Optional[_Union[NamespaceMode, str]] = ..., ipc: _Optional[_Union[NamespaceMode, str]] = ..., target_id: _Optional[str] = ...) -> None: ...

class LinuxSandboxSecurityContext(_message.Message):
    __slots__ = ("namespace_options", "privileged")
    NAMESPACE_OPTIONS_FIELD_NUMBER: _ClassVar[int]
    PRIVILEGED_FIELD_NUMBER: _ClassVar[int]
    namespace_options: NamespaceOption
    privileged: bool
    def __init__(self, namespace_options: _Optional[_Union[NamespaceOption, _Mapping]] = ..., privileged: _Optional[bool] = ...) -> None: ...

class LinuxPodSandboxConfig(_message.Message):
    __slots__ = ("cgroup_parent", "security_context")
    CGROUP_PARENT_FIELD_NUMBER: _ClassVar[int]
    SECURITY_CONTEXT_FIELD_NUMBER: _ClassVar[int]
    cgroup_parent: str
    security_context: LinuxSandboxSecurityContext
    def __init__(self, cgroup_parent: _Optional[str] = ..., security_context: _Optional[_Union[LinuxSandboxSecurityContext, _Mapping]] = ...) -> None: ...

class PodSandboxConfig(_message.Message):
    __slots__ = ("metadata", "hostname", "log_directory", "labels", "annotations", "linux")
    class LabelsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    class AnnotationsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    METADATA_FIELD_NUMBER: _ClassVar[int]
    HOSTNAME_FIELD_NUMBER: _ClassVar[int]
    LOG_DIRECTORY_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    ANNOTATIONS_FIELD_NUMBER: _ClassVar[int]
    LINUX_FIELD_NUMBER: _ClassVar[int]
    metadata: PodSandboxMetadata
    hostname: str
    log_directory: str
    labels: _containers.ScalarMap[str, str]
    annotations: _containers.ScalarMap[str, str]
    linux: LinuxPodSandboxConfig
    def __init__(self, metadata: _Optional[_Union[PodSandboxMetadata, _Mapping]] = ..., hostname: _Optional[str] = ..., log_directory: _Optional[str] = ..., labels: _Optional[_Mapping[str, str]] = ..., annotations: _Optional[_Mapping[str, str]] = ..., linux: _Optional[_Union[LinuxPodSandboxConfig, _Mapping]] = ...) -> None: ...

class RunPodSandboxRequest(_message.Message):
    __slots__ = ("config", "runtime_handler")
    CONFIG_FIELD_NUMBER: _ClassVar[int]
    RUNTIME_HANDLER_FIELD_NUMBER: _ClassVar[int]
    config: PodSandboxConfig
    runtime_handler: str
    def __init__(self, config: _Optional[_Union[PodSandboxConfig, _Mapping]] = ..., runtime_handler: _Optional[str] = ...) -> None: ...

class RunPodSandboxResponse(_message.Message):
    __slots__ = ("pod_sandbox_id",)
    POD_SANDBOX_ID_FIELD_NUMBER: _ClassVar[int]
    pod_sandbox_id: str
    def __init__(self, pod_sandbox_id: _Optional[str] = ...) -> None: ...

class StopPodSandboxRequest(_message.Message):
    __slots__ = ("pod_sandbox_id",)
    POD_SANDBOX_ID_FIELD_NUMBER: _ClassVar[int]
    pod_sandbox_id: str
    def __init__(self, pod_sandbox_id: _Optional[str] = ...) -> None: ...

class StopPodSandboxResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class RemovePodSandboxRequest(_message.Message):
    __slots__ = ("pod_sandbox_id",)
    POD_SANDBOX_ID_FIELD_NUMBER: _ClassVar[int]
    pod_sandbox_id: str
    def __init__(self, pod_sandbox_id: _Optional[str] = ...) -> None: ...

class RemovePodSandboxResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class PodSandboxStatusRequest(_message.Message):
    __slots__ = ("pod_sandbox_id", "verbose")
    POD_SANDBOX_ID_FIELD_NUMBER: _ClassVar[int]
    VERBOSE_FIELD_NUMBER: _ClassVar[int]
    pod_sandbox_id: str
    verbose: bool
    def __init__(self, pod_sandbox_id: _Optional[str] = ..., verbose: _Optional[bool] = ...) -> None: ...

class PodIP(_message.Message):
    __slots__ = ("ip",)
    IP_FIELD_NUMBER: _ClassVar[int]
    ip: str
    def __init__(self, ip: _Optional[str] = ...) -> None: ...

class PodSandboxNetworkStatus(_message.Message):
    __slots__ = ("ip", "additional_ips")
    IP_FIELD_NUMBER: _ClassVar[int]
    ADDITIONAL_IPS_FIELD_NUMBER: _ClassVar[int]
    ip: str
    additional_ips: _containers.RepeatedCompositeFieldContainer[PodIP]
    def __init__(self, ip: _Optional[str] = ..., additional_ips: _Optional[_Iterable[_Union[PodIP, _Mapping]]] = ...) -> None: ...

class Namespace(_message.Message):
    __slots__ = ("options",)
    OPTIONS_FIELD_NUMBER: _ClassVar[int]
    options: NamespaceOption
    def __init__(self, options: _Optional[_Union[NamespaceOption, _Mapping]] = ...) -> None: ...

class LinuxPodSandboxStatus(_message.Message):
    __slots__ = ("namespaces",)
    NAMESPACES_FIELD_NUMBER: _ClassVar[int]
    namespaces: Namespace
    def __init__(self, namespaces: _Optional[_Union[Namespace, _Mapping]] = ...) -> None: ...

class PodSandboxStatus(_message.Message):
    __slots__ = ("id", "metadata", "state", "created_at", "network", "linux", "labels", "annotations", "runtime_handler")
    class LabelsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    class AnnotationsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    ID_FIELD_NUMBER: _ClassVar[int]
    METADATA_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_FIELD_NUMBER: _ClassVar[int]
    NETWORK_FIELD_NUMBER: _ClassVar[int]
    LINUX_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    ANNOTATIONS_FIELD_NUMBER: _ClassVar[int]
    RUNTIME_HANDLER_FIELD_NUMBER: _ClassVar[int]
    id: str
    metadata: PodSandboxMetadata
    state: PodSandboxState
    created_at: int
    network: PodSandboxNetworkStatus
    linux: LinuxPodSandboxStatus
    labels: _containers.ScalarMap[str, str]
    annotations: _containers.ScalarMap[str, str]
    runtime_handler: str
    def __init__(self, id: _Optional[str] = ..., metadata: _Optional[_Union[PodSandboxMetadata, _Mapping]] = ..., state: _Optional[_Union[PodSandboxState, str]] = ..., created_at: _Optional[int] = ..., network: _Optional[_Union[PodSandboxNetworkStatus, _Mapping]] = ..., linux: _Optional[_Union[LinuxPodSandboxStatus, _Mapping]] = ..., labels: _Optional[_Mapping[str, str]] = ..., annotations: _Optional[_Mapping[str, str]] = ..., runtime_handler: _Optional[str] = ...) -> None: ...

class PodSandboxStatusResponse(_message.Message):
    __slots__ = ("status", "info", "containers_statuses", "timestamp")
    class InfoEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    STATUS_FIELD_NUMBER: _ClassVar[int]
    INFO_FIELD_NUMBER: _ClassVar[int]
    CONTAINERS_STATUSES_FIELD_NUMBER: _ClassVar[int]
    TIMESTAMP_FIELD_NUMBER: _ClassVar[int]
    status: PodSandboxStatus
    info: _containers.ScalarMap[str, str]
    containers_statuses: _containers.RepeatedCompositeFieldContainer[ContainerStatus]
    timestamp: int
    def __init__(self, status: _Optional[_Union[PodSandboxStatus, _Mapping]] = ..., info: _Optional[_Mapping[str, str]] = ..., containers_statuses: _Optional[_Iterable[_Union[ContainerStatus, _Mapping]]] = ..., timestamp: _Optional[int] = ...) -> None: ...

class PodSandboxStateValue(_message.Message):
    __slots__ = ("state",)
    STATE_FIELD_NUMBER: _ClassVar[int]
    state: PodSandboxState
    def __init__(self, state: _Optional[_Union[PodSandboxState, str]] = ...) -> None: ...

class PodSandboxFilter(_message.Message):
    __slots__ = ("id", "state", "label_selector")
    class LabelSelectorEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    ID_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    LABEL_SELECTOR_FIELD_NUMBER: _ClassVar[int]
    id: str
    state: PodSandboxStateValue
    label_selector: _containers.ScalarMap[str, str]
    def __init__(self, id: _Optional[str] = ..., state: _Optional[_Union[PodSandboxStateValue, _Mapping]] = ..., label_selector: _Optional[_Mapping[str, str]] = ...) -> None: ...

class ListPodSandboxRequest(_message.Message):
    __slots__ = ("filter",)
    FILTER_FIELD_NUMBER: _ClassVar[int]
    filter: PodSandboxFilter
    def __init__(self, filter: _Optional[_Union[PodSandboxFilter, _Mapping]] = ...) -> None: ...

class PodSandbox(_message.Message):
    __slots__ = ("id", "metadata", "state", "created_at", "labels", "annotations", "runtime_handler")
    class LabelsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    class AnnotationsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    ID_FIELD_NUMBER: _ClassVar[int]
    METADATA_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    ANNOTATIONS_FIELD_NUMBER: _ClassVar[int]
    RUNTIME_HANDLER_FIELD_NUMBER: _ClassVar[int]
    id: str
    metadata: PodSandboxMetadata
    state: PodSandboxState
    created_at: int
    labels: _containers.ScalarMap[str, str]
    annotations: _containers.ScalarMap[str, str]
    runtime_handler: str
    def __init__(self, id: _Optional[str] = ..., metadata: _Optional[_Union[PodSandboxMetadata, _Mapping]] = ..., state: _Optional[_Union[PodSandboxState, str]] = ..., created_at: _Optional[int] = ..., labels: _Optional[_Mapping[str, str]] = ..., annotations: _Optional[_Mapping[str, str]] = ..., runtime_handler: _Optional[str] = ...) -> None: ...

class ListPodSandboxResponse(_message.Message):
    __slots__ = ("items",)
    ITEMS_FIELD_NUMBER: _ClassVar[int]
    items: _containers.RepeatedCompositeFieldContainer[PodSandbox]
    def __init__(self, items: _Optional[_Iterable[_Union[PodSandbox, _Mapping]]] = ...) -> None: ...

class PodSandboxStats(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListPodSandboxStatsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListPodSandboxStatsResponse(_message.Message):
    __slots__ = ("stats",)
    STATS_FIELD_NUMBER: _ClassVar[int]
    stats: _containers.RepeatedCompositeFieldContainer[PodSandboxStats]
    def __init__(self, stats: _Optional[_Iterable[_Union[PodSandboxStats, _Mapping]]] = ...) -> None: ...

class ListMetricDescriptorsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListMetricDescriptorsResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListPodSandboxMetricsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListPodSandboxMetricsResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ImageSpec(_message.Message):
    __slots__ = ("image", "annotations", "user_specified_image", "runtime_handler", "image_ref")
    class AnnotationsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    IMAGE_FIELD_NUMBER: _ClassVar[int]
    ANNOTATIONS_FIELD_NUMBER: _ClassVar[int]
    USER_SPECIFIED_IMAGE_FIELD_NUMBER: _ClassVar[int]
    RUNTIME_HANDLER_FIELD_NUMBER: _ClassVar[int]
    IMAGE_REF_FIELD_NUMBER: _ClassVar[int]
    image: str
    annotations: _containers.ScalarMap[str, str]
    user_specified_image: str
    runtime_handler: str
    image_ref: str
    def __init__(self, image: _Optional[str] = ..., annotations: _Optional[_Mapping[str, str]] = ..., user_specified_image: _Optional[str] = ..., runtime_handler: _Optional[str] = ..., image_ref: _Optional[str] = ...) -> None: ...

class KeyValue(_message.Message):
    __slots__ = ("key", "value")
    KEY_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    key: str
    value: str
    def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...

class ContainerMetadata(_message.Message):
    __slots__ = ("name", "attempt")
    NAME_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    name: str
    attempt: int
    def __init__(self, name: _Optional[str] = ..., attempt: _Optional[int] = ...) -> None: ...

class Mount(_message.Message):
    __slots__ = ("container_path", "host_path", "readonly")
    CONTAINER_PATH_FIELD_NUMBER: _ClassVar[int]
    HOST_PATH_FIELD_NUMBER: _ClassVar[int]
    READONLY_FIELD_NUMBER: _ClassVar[int]
    container_path: str
    host_path: str
    readonly: bool
    def __init__(self, container_path: _Optional[str] = ..., host_path: _Optional[str] = ..., readonly: _Optional[bool] = ...) -> None: ...

class Device(_message.Message):
    __slots__ = ("container_path", "host_path", "permissions")
    CONTAINER_PATH_FIELD_NUMBER: _ClassVar[int]
    HOST_PATH_FIELD_NUMBER: _ClassVar[int]
    PERMISSIONS_FIELD_NUMBER: _ClassVar[int]
    container_path: str
    host_path: str
    permissions: str
    def __init__(self, container_path: _Optional[str] = ..., host_path: _Optional[str] = ..., permissions: _Optional[str] = ...) -> None: ...

class CDIDevice(_message.Message):
    __slots__ = ("name",)
    NAME_FIELD_NUMBER: _ClassVar[int]
    name: str
    def __init__(self, name: _Optional[str] = ...) -> None: ...

class LinuxContainerSecurityContext(_message.Message):
    __slots__ = ("privileged", "namespace_options")
    PRIVILEGED_FIELD_NUMBER: _ClassVar[int]
    NAMESPACE_OPTIONS_FIELD_NUMBER: _ClassVar[int]
    privileged: bool
    namespace_options: NamespaceOption
    def __init__(self, privileged: _Optional[bool] = ..., namespace_options: _Optional[_Union[NamespaceOption, _Mapping]] = ...) -> None: ...

class LinuxContainerConfig(_message.Message):
    __slots__ = ("security_context",)
    SECURITY_CONTEXT_FIELD_NUMBER: _ClassVar[int]
    security_context: LinuxContainerSecurityContext
    def __init__(self, security_context: _Optional[_Union[LinuxContainerSecurityContext, _Mapping]] = ...) -> None: ...

class ContainerConfig(_message.Message):
    __slots__ = ("metadata", "image", "command", "args", "working_dir", "envs", "mounts", "devices", "labels", "annotations", "log_path", "linux", "CDI_devices")
    class LabelsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    class AnnotationsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    METADATA_FIELD_NUMBER: _ClassVar[int]
    IMAGE_FIELD_NUMBER: _ClassVar[int]
    COMMAND_FIELD_NUMBER: _ClassVar[int]
    ARGS_FIELD_NUMBER: _ClassVar[int]
    WORKING_DIR_FIELD_NUMBER: _ClassVar[int]
    ENVS_FIELD_NUMBER: _ClassVar[int]
    MOUNTS_FIELD_NUMBER: _ClassVar[int]
    DEVICES_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    ANNOTATIONS_FIELD_NUMBER: _ClassVar[int]
    LOG_PATH_FIELD_NUMBER: _ClassVar[int]
    LINUX_FIELD_NUMBER: _ClassVar[int]
    CDI_DEVICES_FIELD_NUMBER: _ClassVar[int]
    metadata: ContainerMetadata
    image: ImageSpec
    command: _containers.RepeatedScalarFieldContainer[str]
    args: _containers.RepeatedScalarFieldContainer[str]
    working_dir: str
    envs: _containers.RepeatedCompositeFieldContainer[KeyValue]
    mounts: _containers.RepeatedCompositeFieldContainer[Mount]
    devices: _containers.RepeatedCompositeFieldContainer[Device]
    labels: _containers.ScalarMap[str, str]
    annotations: _containers.ScalarMap[str, str]
    log_path: str
    linux: LinuxContainerConfig
    CDI_devices: _containers.RepeatedCompositeFieldContainer[CDIDevice]
    def __init__(self, metadata: _Optional[_Union[ContainerMetadata, _Mapping]] = ..., image: _Optional[_Union[ImageSpec, _Mapping]] = ..., command: _Optional[_Iterable[str]] = ..., args: _Optional[_Iterable[str]] = ..., working_dir: _Optional[str] = ..., envs: _Optional[_Iterable[_Union[KeyValue, _Mapping]]] = ..., mounts: _Optional[_Iterable[_Union[Mount, _Mapping]]] = ..., devices: _Optional[_Iterable[_Union[Device, _Mapping]]] = ..., labels: _Optional[_Mapping[str, str]] = ..., annotations: _Optional[_Mapping[str, str]] = ..., log_path: _Optional[str] = ..., linux: _Optional[_Union[LinuxContainerConfig, _Mapping]] = ..., CDI_devices: _Optional[_Iterable[_Union[CDIDevice, _Mapping]]] = ...) -> None: ...

class CreateContainerRequest(_message.Message):
    __slots__ = ("pod_sandbox_id", "config", "sandbox_config")
    POD_SANDBOX_ID_FIELD_NUMBER: _ClassVar[int]
    CONFIG_FIELD_NUMBER: _ClassVar[int]
    SANDBOX_CONFIG_FIELD_NUMBER: _ClassVar[int]
    pod_sandbox_id: str
    config: ContainerConfig
    sandbox_config: PodSandboxConfig
    def __init__(self, pod_sandbox_id: _Optional[str] = ..., config: _Optional[_Union[ContainerConfig, _Mapping]] = ..., sandbox_config: _Optional[_Union[PodSandboxConfig, _Mapping]] = ...) -> None: ...

class CreateContainerResponse(_message.Message):
    __slots__ = ("container_id",)
    CONTAINER_ID_FIELD_NUMBER: _ClassVar[int]
    container_id: str
    def __init__(self, container_id: _Optional[str] = ...) -> None: ...

class StartContainerRequest(_message.Message):
    __slots__ = ("container_id",)
    CONTAINER_ID_FIELD_NUMBER: _ClassVar[int]
    container_id: str
    def __init__(self, container_id: _Optional[str] = ...) -> None: ...

class StartContainerResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class StopContainerRequest(_message.Message):
    __slots__ = ("container_id", "timeout")
    CONTAINER_ID_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_FIELD_NUMBER: _ClassVar[int]
    container_id: str
    timeout: int
    def __init__(self, container_id: _Optional[str] = ..., timeout: _Optional[int] = ...) -> None: ...

class StopContainerResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class RemoveContainerRequest(_message.Message):
    __slots__ = ("container_id",)
    CONTAINER_ID_FIELD_NUMBER: _ClassVar[int]
    container_id: str
    def __init__(self, container_id: _Optional[str] = ...) -> None: ...

class RemoveContainerResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ContainerStateValue(_message.Message):
    __slots__ = ("state",)
    STATE_FIELD_NUMBER: _ClassVar[int]
    state: ContainerState
    def __init__(self, state: _Optional[_Union[ContainerState, str]] = ...) -> None: ...

class ContainerFilter(_message.Message):
    __slots__ = ("id", "state", "pod_sandbox_id", "label_selector")
    class LabelSelectorEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    ID_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    POD_SANDBOX_ID_FIELD_NUMBER: _ClassVar[int]
    LABEL_SELECTOR_FIELD_NUMBER: _ClassVar[int]
    id: str
    state: ContainerStateValue
    pod_sandbox_id: str
    label_selector: _containers.ScalarMap[str, str]
    def __init__(self, id: _Optional[str] = ..., state: _Optional[_Union[ContainerStateValue, _Mapping]] = ..., pod_sandbox_id: _Optional[str] = ..., label_selector: _Optional[_Mapping[str, str]] = ...) -> None: ...

class ListContainersRequest(_message.Message):
    __slots__ = ("filter",)
    FILTER_FIELD_NUMBER: _ClassVar[int]
    filter: ContainerFilter
    def __init__(self, filter: _Optional[_Union[ContainerFilter, _Mapping]] = ...) -> None: ...

class Container(_message.Message):
    __slots__ = ("id", "pod_sandbox_id", "metadata", "image", "image_ref", "state", "created_at", "labels", "annotations", "image_id")
    class LabelsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    class AnnotationsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    ID_FIELD_NUMBER: _ClassVar[int]
    POD_SANDBOX_ID_FIELD_NUMBER: _ClassVar[int]
    METADATA_FIELD_NUMBER: _ClassVar[int]
    IMAGE_FIELD_NUMBER: _ClassVar[int]
    IMAGE_REF_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    ANNOTATIONS_FIELD_NUMBER: _ClassVar[int]
    IMAGE_ID_FIELD_NUMBER: _ClassVar[int]
    id: str
    pod_sandbox_id: str
    metadata: ContainerMetadata
    image: ImageSpec
    image_ref: str
    state: ContainerState
    created_at: int
    labels: _containers.ScalarMap[str, str]
    annotations: _containers.ScalarMap[str, str]
    image_id: str
    def __init__(self, id: _Optional[str] = ..., pod_sandbox_id: _Optional[str] = ..., metadata: _Optional[_Union[ContainerMetadata, _Mapping]] = ..., image: _Optional[_Union[ImageSpec, _Mapping]] = ..., image_ref: _Optional[str] = ..., state: _Optional[_Union[ContainerState, str]] = ..., created_at: _Optional[int] = ..., labels: _Optional[_Mapping[str, str]] = ..., annotations: _Optional[_Mapping[str, str]] = ..., image_id: _Optional[str] = ...) -> None: ...

class ListContainersResponse(_message.Message):
    __slots__ = ("containers",)
    CONTAINERS_FIELD_NUMBER: _ClassVar[int]
    containers: _containers.RepeatedCompositeFieldContainer[Container]
    def __init__(self, containers: _Optional[_Iterable[_Union[Container, _Mapping]]] = ...) -> None: ...

class ContainerStatusRequest(_message.Message):
    __slots__ = ("container_id", "verbose")
    CONTAINER_ID_FIELD_NUMBER: _ClassVar[int]
    VERBOSE_FIELD_NUMBER: _ClassVar[int]
    container_id: str
    verbose: bool
    def __init__(self, container_id: _Optional[str] = ..., verbose: _Optional[bool] = ...) -> None: ...

class ContainerStatus(_message.Message):
    __slots__ = ("id", "metadata", "state", "created_at", "started_at", "finished_at", "exit_code", "image", "image_ref", "reason", "message", "labels", "annotations", "mounts", "log_path", "image_id")
    class LabelsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    class AnnotationsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    ID_FIELD_NUMBER: _ClassVar[int]
    METADATA_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_FIELD_NUMBER: _ClassVar[int]
    STARTED_AT_FIELD_NUMBER: _ClassVar[int]
    FINISHED_AT_FIELD_NUMBER: _ClassVar[int]
    EXIT_CODE_FIELD_NUMBER: _ClassVar[int]
    IMAGE_FIELD_NUMBER: _ClassVar[int]
    IMAGE_REF_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    ANNOTATIONS_FIELD_NUMBER: _ClassVar[int]
    MOUNTS_FIELD_NUMBER: _ClassVar[int]
    LOG_PATH_FIELD_NUMBER: _ClassVar[int]
    IMAGE_ID_FIELD_NUMBER: _ClassVar[int]
    id: str
    metadata: ContainerMetadata
    state: ContainerState
    created_at: int
    started_at: int
    finished_at: int
    exit_code: int
    image: ImageSpec
    image_ref: str
    reason: str
    message: str
    labels: _containers.ScalarMap[str, str]
    annotations: _containers.ScalarMap[str, str]
    mounts: _containers.RepeatedCompositeFieldContainer[Mount]
    log_path: str
    image_id: str
    def __init__(self, id: _Optional[str] = ..., metadata: _Optional[_Union[ContainerMetadata, _Mapping]] = ..., state: _Optional[_Union[ContainerState, str]] = ..., created_at: _Optional[int] = ..., started_at: _Optional[int] = ..., finished_at: _Optional[int] = ..., exit_code: _Optional[int] = ..., image: _Optional[_Union[ImageSpec, _Mapping]] = ..., image_ref: _Optional[str] = ..., reason: _Optional[str] = ..., message: _Optional[str] = ..., labels: _Optional[_Mapping[str, str]] = ..., annotations: _Optional[_Mapping[str, str]] = ..., mounts: _Optional[_Iterable[_Union[Mount, _Mapping]]] = ..., log_path: _Optional[str] = ..., image_id: _Optional[str] = ...) -> None: ...

class ContainerStatusResponse(_message.Message):
    __slots__ = ("status", "info")
    class InfoEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    STATUS_FIELD_NUMBER: _ClassVar[int]
    INFO_FIELD_NUMBER: _ClassVar[int]
    status: ContainerStatus
    info: _containers.ScalarMap[str, str]
    def __init__(self, status: _Optional[_Union[ContainerStatus, _Mapping]] = ..., info: _Optional[_Mapping[str, str]] = ...) -> None: ...

class UpdateContainerResourcesRequest(_message.Message):
    __slots__ = ("container_id",)
    CONTAINER_ID_FIELD_NUMBER: _ClassVar[int]
    container_id: str
    def __init__(self, container_id: _Optional[str] = ...) -> None: ...

class UpdateContainerResourcesResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ReopenContainerLogRequest(_message.Message):
    __slots__ = ("container_id",)
    CONTAINER_ID_FIELD_NUMBER: _ClassVar[int]
    container_id: str
    def __init__(self, container_id: _Optional[str] = ...) -> None: ...

class ReopenContainerLogResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ExecSyncRequest(_message.Message):
    __slots__ = ("container_id", "cmd", "timeout")
    CONTAINER_ID_FIELD_NUMBER: _ClassVar[int]
    CMD_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_FIELD_NUMBER: _ClassVar[int]
    container_id: str
    cmd: _containers.RepeatedScalarFieldContainer[str]
    timeout: int
    def __init__(self, container_id: _Optional[str] = ..., cmd: _Optional[_Iterable[str]] = ..., timeout: _Optional[int] = ...) -> None: ...

class ExecSyncResponse(_message.Message):
    __slots__ = ("stdout", "stderr", "exit_code")
    STDOUT_FIELD_NUMBER: _ClassVar[int]
    STDERR_FIELD_NUMBER: _ClassVar[int]
    EXIT_CODE_FIELD_NUMBER: _ClassVar[int]
    stdout: bytes
    stderr: bytes
    exit_code: int
    def __init__(self, stdout: _Optional[bytes] = ..., stderr: _Optional[bytes] = ..., exit_code: _Optional[int] = ...) -> None: ...

class ContainerStats(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListContainerStatsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListContainerStatsResponse(_message.Message):
    __slots__ = ("stats",)
    STATS_FIELD_NUMBER: _ClassVar[int]
    stats: _containers.RepeatedCompositeFieldContainer[ContainerStats]
    def __init__(self, stats: _Optional[_Iterable[_Union[ContainerStats, _Mapping]]] = ...) -> None: ...

class ImageFilter(_message.Message):
    __slots__ = ("image",)
    IMAGE_FIELD_NUMBER: _ClassVar[int]
    image: ImageSpec
    def __init__(self, image: _Optional[_Union[ImageSpec, _Mapping]] = ...) -> None: ...

class ListImagesRequest(_message.Message):
    __slots__ = ("filter",)
    FILTER_FIELD_NUMBER: _ClassVar[int]
    filter: ImageFilter
    def __init__(self, filter: _Optional[_Union[ImageFilter, _Mapping]] = ...) -> None: ...

class Image(_message.Message):
    __slots__ = ("id", "repo_tags", "repo_digests", "size", "spec", "pinned")
    ID_FIELD_NUMBER: _ClassVar[int]
    REPO_TAGS_FIELD_NUMBER: _ClassVar[int]
    REPO_DIGESTS_FIELD_NUMBER: _ClassVar[int]
    SIZE_FIELD_NUMBER: _ClassVar[int]
    SPEC_FIELD_NUMBER: _ClassVar[int]
    PINNED_FIELD_NUMBER: _ClassVar[int]
    id: str
    repo_tags: _containers.RepeatedScalarFieldContainer[str]
    repo_digests: _containers.RepeatedScalarFieldContainer[str]
    size: int
    spec: ImageSpec
    pinned: bool
    def __init__(self, id: _Optional[str] = ..., repo_tags: _Optional[_Iterable[str]] = ..., repo_digests: _Optional[_Iterable[str]] = ..., size: _Optional[int] = ..., spec: _Optional[_Union[ImageSpec, _Mapping]] = ..., pinned: _Optional[bool] = ...) -> None: ...

class ListImagesResponse(_message.Message):
    __slots__ = ("images",)
    IMAGES_FIELD_NUMBER: _ClassVar[int]
    images: _containers.RepeatedCompositeFieldContainer[Image]
    def __init__(self, images: _Optional[_Iterable[_Union[Image, _Mapping]]] = ...) -> None: ...

class ImageStatusRequest(_message.Message):
    __slots__ = ("image", "verbose")
    IMAGE_FIELD_NUMBER: _ClassVar[int]
    VERBOSE_FIELD_NUMBER: _ClassVar[int]
    image: ImageSpec
    verbose: bool
    def __init__(self, image: _Optional[_Union[ImageSpec, _Mapping]] = ..., verbose: _Optional[bool] = ...) -> None: ...

class ImageStatusResponse(_message.Message):
    __slots__ = ("image", "info")
    class InfoEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    IMAGE_FIELD_NUMBER: _ClassVar[int]
    INFO_FIELD_NUMBER: _ClassVar[int]
    image: Image
    info: _containers.ScalarMap[str, str]
    def __init__(self, image: _Optional[_Union[Image, _Mapping]] = ..., info: _Optional[_Mapping[str, str]] = ...) -> None: ...

class PullImageRequest(_message.Message):
    __slots__ = ("image", "sandbox_config")
    IMAGE_FIELD_NUMBER: _ClassVar[int]
    SANDBOX_CONFIG_FIELD_NUMBER: _ClassVar[int]
    image: ImageSpec
    sandbox_config: PodSandboxConfig
    def __init__(self, image: _Optional[_Union[ImageSpec, _Mapping]] = ..., sandbox_config: _Optional[_Union[PodSandboxConfig, _Mapping]] = ...) -> None: ...

class PullImageResponse(_message.Message):
    __slots__ = ("image_ref",)
    IMAGE_REF_FIELD_NUMBER: _ClassVar[int]
    image_ref: str
    def __init__(self, image_ref: _Optional[str] = ...) -> None: ...

class RemoveImageRequest(_message.Message):
    __slots__ = ("image",)
    IMAGE_FIELD_NUMBER: _ClassVar[int]
    image: ImageSpec
    def __init__(self, image: _Optional[_Union[ImageSpec, _Mapping]] = ...) -> None: ...

class RemoveImageResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ImageFsInfoRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class UInt64Value(_message.Message):
    __slots__ = ("value",)
    VALUE_FIELD_NUMBER: _ClassVar[int]
    value: int
    def __init__(self, value: _Optional[int] = ...) -> None: ...

class FilesystemIdentifier(_message.Message):
    __slots__ = ("mountpoint",)
    MOUNTPOINT_FIELD_NUMBER: _ClassVar[int]
    mountpoint: str
    def __init__(self, mountpoint: _Optional[str] = ...) -> None: ...

class FilesystemUsage(_message.Message):
    __slots__ = ("timestamp", "fs_id", "used_bytes", "inodes_used")
    TIMESTAMP_FIELD_NUMBER: _ClassVar[int]
    FS_ID_FIELD_NUMBER: _ClassVar[int]
    USED_BYTES_FIELD_NUMBER: _ClassVar[int]
    INODES_USED_FIELD_NUMBER: _ClassVar[int]
    timestamp: int
    fs_id: FilesystemIdentifier
    used_bytes: UInt64Value
    inodes_used: UInt64Value
    def __init__(self, timestamp: _Optional[int] = ..., fs_id: _Optional[_Union[FilesystemIdentifier, _Mapping]] = ..., used_bytes: _Optional[_Union[UInt64Value, _Mapping]] = ..., inodes_used: _Optional[_Union[UInt64Value, _Mapping]] = ...) -> None: ...

class ImageFsInfoResponse(_message.Message):
    __slots__ = ("image_filesystems", "container_filesystems")
    IMAGE_FILESYSTEMS_FIELD_NUMBER: _ClassVar[int]
    CONTAINER_FILESYSTEMS_FIELD_NUMBER: _ClassVar[int]
    image_filesystems: _containers.RepeatedCompositeFieldContainer[FilesystemUsage]
    container_filesystems: _containers.RepeatedCompositeFieldContainer[FilesystemUsage]
    def __init__(self, image_filesystems: _Optional[_Iterable[_Union[FilesystemUsage, _Mapping]]] = ..., container_filesystems: _Optional[_Iterable[_Union[FilesystemUsage, _Mapping]]] = ...) -> None: ...
