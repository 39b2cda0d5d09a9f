from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Zone(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    ZONE_UNSPECIFIED: _ClassVar[Zone]
    PINNED: _ClassVar[Zone]
    NORMAL: _ClassVar[Zone]

class Folder(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    FOLDER_UNSPECIFIED: _ClassVar[Folder]
    MAIN: _ClassVar[Folder]
    ARCHIVED: _ClassVar[Folder]
ZONE_UNSPECIFIED: Zone
PINNED: Zone
NORMAL: Zone
FOLDER_UNSPECIFIED: Folder
MAIN: Folder
ARCHIVED: Folder

class CursorPosition(_message.Message):
    __slots__ = ("snapshot_revision", "zone", "pin_rank", "last_activity_id", "conversation_id", "user_id", "folder", "server_epoch")
    SNAPSHOT_REVISION_FIELD_NUMBER: _ClassVar[int]
    ZONE_FIELD_NUMBER: _ClassVar[int]
    PIN_RANK_FIELD_NUMBER: _ClassVar[int]
    LAST_ACTIVITY_ID_FIELD_NUMBER: _ClassVar[int]
    CONVERSATION_ID_FIELD_NUMBER: _ClassVar[int]
    USER_ID_FIELD_NUMBER: _ClassVar[int]
    FOLDER_FIELD_NUMBER: _ClassVar[int]
    SERVER_EPOCH_FIELD_NUMBER: _ClassVar[int]
    snapshot_revision: int
    zone: Zone
    pin_rank: int
    last_activity_id: bytes
    conversation_id: bytes
    user_id: int
    folder: Folder
    server_epoch: int
    def __init__(self, snapshot_revision: _Optional[int] = ..., zone: _Optional[_Union[Zone, str]] = ..., pin_rank: _Optional[int] = ..., last_activity_id: _Optional[bytes] = ..., conversation_id: _Optional[bytes] = ..., user_id: _Optional[int] = ..., folder: _Optional[_Union[Folder, str]] = ..., server_epoch: _Optional[int] = ...) -> None: ...

class PageCursor(_message.Message):
    __slots__ = ("position", "mac")
    POSITION_FIELD_NUMBER: _ClassVar[int]
    MAC_FIELD_NUMBER: _ClassVar[int]
    position: bytes
    mac: bytes
    def __init__(self, position: _Optional[bytes] = ..., mac: _Optional[bytes] = ...) -> None: ...
