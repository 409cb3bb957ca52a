"""Writes records the Python client cannot: any bytes in header names, through librdkafka's
C API (the copy bundled in the confluent-kafka wheel) by ctypes.

confluent-kafka's `Producer` takes header names as `str`, so it can never write a name
that is not UTF-8, or one with a NUL in it; any client in another language can. This
producer adds each header with an explicit length (`rd_kafka_header_add`) and produces
with `rd_kafka_produceva`, then waits for every delivery report and raises on a failed
one, so a test never believes a record was written that was not.
"""

from __future__ import annotations

import ctypes
import glob
import os
from typing import Any

import confluent_kafka

RawHeader = tuple[bytes, bytes | None]

_VTYPE_TOPIC = 1
_VTYPE_PARTITION = 3
_VTYPE_VALUE = 4
_VTYPE_KEY = 5
_VTYPE_HEADERS = 10
_CONF_OK = 0


class _Mem(ctypes.Structure):
    _fields_ = [("ptr", ctypes.c_void_p), ("size", ctypes.c_size_t)]


class _Union(ctypes.Union):
    _fields_ = [
        ("cstr", ctypes.c_char_p),
        ("i32", ctypes.c_int32),
        ("mem", _Mem),
        ("ptr", ctypes.c_void_p),
        ("pad", ctypes.c_char * 64),
    ]


class _Vu(ctypes.Structure):
    """`rd_kafka_vu_t`: a type tag and a union of the values produceva takes."""

    _fields_ = [("vtype", ctypes.c_int), ("u", _Union)]


_DR_CB = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p)


def _library() -> Any:
    wheel_libs = os.path.join(os.path.dirname(confluent_kafka.__file__), os.pardir)
    found = glob.glob(os.path.join(wheel_libs, "confluent_kafka.libs", "librdkafka*.so*"))
    if not found:
        raise RuntimeError("no librdkafka bundled with confluent-kafka was found")
    lib = ctypes.CDLL(found[0])
    lib.rd_kafka_conf_new.restype = ctypes.c_void_p
    lib.rd_kafka_conf_set.argtypes = [
        ctypes.c_void_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_size_t
    ]  # fmt: skip
    lib.rd_kafka_conf_set_dr_msg_cb.argtypes = [ctypes.c_void_p, _DR_CB]
    lib.rd_kafka_new.restype = ctypes.c_void_p
    lib.rd_kafka_new.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_char_p, ctypes.c_size_t]
    lib.rd_kafka_headers_new.restype = ctypes.c_void_p
    lib.rd_kafka_headers_new.argtypes = [ctypes.c_size_t]
    lib.rd_kafka_headers_destroy.argtypes = [ctypes.c_void_p]
    lib.rd_kafka_header_add.argtypes = [
        ctypes.c_void_p, ctypes.c_char_p, ctypes.c_ssize_t, ctypes.c_char_p, ctypes.c_ssize_t
    ]  # fmt: skip
    lib.rd_kafka_produceva.restype = ctypes.c_void_p
    lib.rd_kafka_produceva.argtypes = [ctypes.c_void_p, ctypes.POINTER(_Vu), ctypes.c_size_t]
    lib.rd_kafka_error_string.restype = ctypes.c_char_p
    lib.rd_kafka_error_string.argtypes = [ctypes.c_void_p]
    lib.rd_kafka_error_destroy.argtypes = [ctypes.c_void_p]
    lib.rd_kafka_flush.argtypes = [ctypes.c_void_p, ctypes.c_int]
    lib.rd_kafka_outq_len.argtypes = [ctypes.c_void_p]
    lib.rd_kafka_destroy.argtypes = [ctypes.c_void_p]
    lib.rd_kafka_err2str.restype = ctypes.c_char_p
    return lib


class RawProducer:
    """A librdkafka producer that writes header names as raw bytes. Use as a context
    manager; `produce` queues, `flush` waits for every report and raises on a failure."""

    def __init__(self, bootstrap: str) -> None:
        self._lib = _library()
        self._failures: list[str] = []
        self._callback = _DR_CB(self._on_delivery)  # kept alive as long as the handle
        conf = self._lib.rd_kafka_conf_new()
        for key, value in (
            ("bootstrap.servers", bootstrap),
            ("acks", "all"),
            ("message.max.bytes", "2000000"),
        ):
            self._set(conf, key, value)
        self._lib.rd_kafka_conf_set_dr_msg_cb(conf, self._callback)
        errstr = ctypes.create_string_buffer(512)
        self._rk = self._lib.rd_kafka_new(0, conf, errstr, len(errstr))  # 0: a producer
        if not self._rk:
            raise RuntimeError(f"rd_kafka_new: {errstr.value.decode(errors='replace')}")

    def _set(self, conf: Any, key: str, value: str) -> None:
        errstr = ctypes.create_string_buffer(512)
        result = self._lib.rd_kafka_conf_set(conf, key.encode(), value.encode(), errstr, 512)
        if result != _CONF_OK:
            raise RuntimeError(f"{key}: {errstr.value.decode(errors='replace')}")

    def _on_delivery(self, _rk: Any, rkmessage: Any, _opaque: Any) -> None:
        err = ctypes.cast(rkmessage, ctypes.POINTER(ctypes.c_int))[0]  # rd_kafka_message_t.err
        if err != 0:
            self._failures.append(self._lib.rd_kafka_err2str(err).decode(errors="replace"))

    def produce(
        self,
        topic: str,
        value: bytes | None,
        key: bytes | None,
        headers: list[RawHeader],
        partition: int | None = None,
    ) -> None:
        hdrs = self._lib.rd_kafka_headers_new(len(headers))
        for name, hvalue in headers:
            size = 0 if hvalue is None else len(hvalue)
            self._lib.rd_kafka_header_add(hdrs, name, len(name), hvalue, size)
        args: list[tuple[int, str, Any]] = [(_VTYPE_TOPIC, "cstr", topic.encode())]
        if partition is not None:
            args.append((_VTYPE_PARTITION, "i32", partition))
        buffers = []  # librdkafka copies value and key (RD_KAFKA_MSG_F_COPY is the default)
        for vtype, payload in ((_VTYPE_VALUE, value), (_VTYPE_KEY, key)):
            if payload is not None:
                buf = ctypes.create_string_buffer(payload, len(payload))
                buffers.append(buf)
                args.append((vtype, "mem", _Mem(ctypes.cast(buf, ctypes.c_void_p), len(payload))))
        args.append((_VTYPE_HEADERS, "ptr", hdrs))
        vus = (_Vu * len(args))()
        for slot, (vtype, field, data) in zip(vus, args, strict=True):
            slot.vtype = vtype
            setattr(slot.u, field, data)
        error = self._lib.rd_kafka_produceva(self._rk, vus, len(args))
        if error:
            text = self._lib.rd_kafka_error_string(error).decode(errors="replace")
            self._lib.rd_kafka_error_destroy(error)
            self._lib.rd_kafka_headers_destroy(hdrs)  # not taken over on failure
            raise RuntimeError(f"produceva to {topic}: {text}")

    def flush(self, timeout_s: float = 30.0) -> None:
        self._lib.rd_kafka_flush(self._rk, int(timeout_s * 1000))
        left = self._lib.rd_kafka_outq_len(self._rk)
        if left:
            raise RuntimeError(f"{left} records not delivered within {timeout_s} s")
        if self._failures:
            raise RuntimeError(f"deliveries failed: {self._failures}")

    def close(self) -> None:
        if self._rk:
            self._lib.rd_kafka_destroy(self._rk)
            self._rk = None

    def __enter__(self) -> RawProducer:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()
