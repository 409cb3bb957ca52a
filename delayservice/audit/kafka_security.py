"""The security settings in the Java client's shapes, and the refusal of those it cannot take.

librdkafka names SASL credentials and TLS files as plain settings; the Java client Spark
reads Kafka with wants credentials inside one JAAS line and a PEM client certificate as
file contents in a key store, and reads keys only in PKCS#8. Building those shapes means
reading and checking PEM files and key formats, work of its own, apart from
`kafka_options`'s table of which key becomes which: that module decides what a key is,
this one builds what SASL and SSL keys become. KafkaSettingError is here because every
refusal is a security one: leaving such a key out could connect with weaker settings
than the daemon's. Messages and logs name keys and paths, never values.
"""

from __future__ import annotations

import base64
import binascii
import logging
import re
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path

from delayservice.audit import AuditError
from delayservice.errors import ConfigError, DelayServiceError

log = logging.getLogger(__name__)

PLAIN_MODULE = "org.apache.kafka.common.security.plain.PlainLoginModule"
SCRAM_MODULE = "org.apache.kafka.common.security.scram.ScramLoginModule"
LOGIN_MODULES: Mapping[str, str] = {
    "PLAIN": PLAIN_MODULE,
    "SCRAM-SHA-256": SCRAM_MODULE,
    "SCRAM-SHA-512": SCRAM_MODULE,
}

SASL_CREDENTIALS = frozenset({"sasl.username", "sasl.password"})
SSL_HANDLED = frozenset(
    {
        "ssl.ca.location",
        "ssl.ca.pem",
        "ssl.certificate.location",
        "ssl.certificate.pem",
        "ssl.key.location",
        "ssl.key.pem",
        "ssl.key.password",
        "ssl.keystore.location",
        "ssl.keystore.password",
        "ssl.endpoint.identification.algorithm",
        "enable.ssl.certificate.verification",
    }
)
"""The keys `sasl_options` and `ssl_options` translate, together with others."""

_PEM_BLOCK = re.compile(r"-----BEGIN ([A-Z0-9 ]+)-----\r?\n.*?-----END \1-----", re.DOTALL)
_PBES2_OID = bytes.fromhex("06092a864886f70d01050d")  # 1.2.840.113549.1.5.13


class KafkaSettingError(AuditError, ConfigError):
    """A Kafka setting the audit cannot hand to Spark. A ConfigError too, so the CLI
    exits 2 (bad settings) before Spark starts; the message names the key, never its value."""

    def __init__(self, setting: str, problem: str) -> None:
        DelayServiceError.__init__(self, f"setting {setting}: {problem}")
        self.setting = setting


def jaas_quote(value: str) -> str:
    """A double-quoted JAAS option value. The Java client parses JAAS with
    StreamTokenizer, which reads backslash escapes inside quotes and ends a quoted value
    at a raw line break (then reports the rest of the password as an unknown option), so
    backslashes, quotes and line breaks are all escaped."""
    escaped = (
        value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n").replace("\r", "\\r")
    )
    return f'"{escaped}"'


def sasl_options(
    merged: Mapping[str, str], where: Callable[[str], str], *, has_jaas: bool
) -> dict[str, str]:
    """sasl.mechanism, and for PLAIN and SCRAM a JAAS line built from the credentials."""
    out: dict[str, str] = {}
    mechanism = merged.get("sasl.mechanisms", "").strip()
    if mechanism:
        out["sasl.mechanism"] = mechanism
    given = sorted(SASL_CREDENTIALS & merged.keys())
    if has_jaas:
        if given:
            log.info("--kafka-option sasl.jaas.config takes the place of %s", ", ".join(given))
        return out
    module = LOGIN_MODULES.get(mechanism.upper())
    if module is None:
        if given:
            raise KafkaSettingError(
                where(given[0]),
                f"the audit translates credentials for {', '.join(LOGIN_MODULES)} only, not "
                f"sasl.mechanisms={mechanism or 'GSSAPI (the default)'}; "
                "give --kafka-option sasl.jaas.config=...",
            )
        return out
    for name in sorted(SASL_CREDENTIALS):
        if name not in merged:
            raise KafkaSettingError(
                where("sasl.mechanisms"), f"{mechanism} needs sasl.username and sasl.password"
            )
    out["sasl.jaas.config"] = (
        f"{module} required username={jaas_quote(merged['sasl.username'])} "
        f"password={jaas_quote(merged['sasl.password'])};"
    )
    return out


def ssl_options(merged: Mapping[str, str], where: Callable[[str], str]) -> dict[str, str]:
    """Trust store, key store and host name checking in the Java client's terms."""
    out: dict[str, str] = {}
    out |= _truststore(merged, where)
    out |= _keystore(merged, where)
    algorithm = merged.get("ssl.endpoint.identification.algorithm")
    if algorithm is not None:
        word = algorithm.strip().lower()
        if word not in ("none", "https"):
            raise KafkaSettingError(
                where("ssl.endpoint.identification.algorithm"), "must be none or https"
            )
        out["ssl.endpoint.identification.algorithm"] = "" if word == "none" else "https"
    verification = merged.get("enable.ssl.certificate.verification")
    if verification is not None and verification.strip().lower() in ("false", "0", "no", "off"):
        raise KafkaSettingError(
            where("enable.ssl.certificate.verification"),
            "the Java client cannot turn off certificate checks; give the broker's CA "
            "with ssl.ca.location instead",
        )
    return out


def _truststore(merged: Mapping[str, str], where: Callable[[str], str]) -> dict[str, str]:
    location, pem = merged.get("ssl.ca.location"), merged.get("ssl.ca.pem")
    if location is not None and pem is not None:
        raise KafkaSettingError(where("ssl.ca.pem"), "give ssl.ca.location or ssl.ca.pem, not both")
    if pem is not None:
        blocks = _blocks(pem, "CERTIFICATE")
        if not blocks:
            raise KafkaSettingError(where("ssl.ca.pem"), "holds no PEM certificate")
        return {"ssl.truststore.type": "PEM", "ssl.truststore.certificates": "\n".join(blocks)}
    if location is None:
        return {}
    if location.strip().lower() == "probe":
        log.info("ssl.ca.location=probe: Spark's Kafka client trusts the JVM's default CAs")
        return {}
    path = Path(location).expanduser()
    if path.is_dir():
        raise KafkaSettingError(
            where("ssl.ca.location"),
            f"{path} is a folder; Java's PEM trust store reads one file, so put the "
            "certificates into one file",
        )
    if not _blocks(_read(path, where("ssl.ca.location")), "CERTIFICATE"):
        raise KafkaSettingError(where("ssl.ca.location"), f"{path} holds no PEM certificate")
    return {"ssl.truststore.type": "PEM", "ssl.truststore.location": str(path.absolute())}


def _keystore(merged: Mapping[str, str], where: Callable[[str], str]) -> dict[str, str]:
    """The client certificate: librdkafka's PEM files become Java's PEM key store, which
    takes contents, not paths (the contents also reach a cluster's executors with the
    options); a PKCS#12 file works in both clients as it is."""
    certificate = _pem_source(merged, "ssl.certificate", where)
    key = _pem_source(merged, "ssl.key", where)
    pkcs12 = merged.get("ssl.keystore.location")
    if pkcs12 is not None and (certificate or key):
        raise KafkaSettingError(
            where("ssl.keystore.location"),
            "give a PKCS#12 key store or PEM certificate and key files, not both",
        )
    if pkcs12 is not None:
        out = {"ssl.keystore.type": "PKCS12", "ssl.keystore.location": pkcs12}
        if "ssl.keystore.password" in merged:
            out["ssl.keystore.password"] = merged["ssl.keystore.password"]
        return out
    if certificate is None and key is None:
        return {}
    if certificate is None or key is None:
        given, missing = (
            (key, "ssl.certificate") if certificate is None else (certificate, "ssl.key")
        )
        assert given is not None  # one of the two is there, or we returned above
        raise KafkaSettingError(where(given[0]), f"needs {missing}.location as well")
    (certificate_key, certificate_text), (key_key, key_text) = certificate, key
    chain = _blocks(certificate_text, "CERTIFICATE")
    if not chain:
        raise KafkaSettingError(where(certificate_key), "holds no PEM certificate")
    out = {
        "ssl.keystore.type": "PEM",
        "ssl.keystore.certificate.chain": "\n".join(chain),
        "ssl.keystore.key": _private_key(key_text, where(key_key)),
    }
    encrypted = "ENCRYPTED PRIVATE KEY" in out["ssl.keystore.key"]
    password = merged.get("ssl.key.password")
    if encrypted and password is None:
        raise KafkaSettingError(where(key_key), "holds an encrypted key; give ssl.key.password")
    if encrypted and password is not None:
        out["ssl.key.password"] = password
        _warn_if_pbes2(out["ssl.keystore.key"], where(key_key))
    elif password is not None:
        # librdkafka ignores a password for a plain key; Java fails on it ("overrun").
        log.info("%s is not encrypted; ssl.key.password is left out", where(key_key))
    return out


def _pem_source(
    merged: Mapping[str, str], name: str, where: Callable[[str], str]
) -> tuple[str, str] | None:
    """(setting, PEM text) from `<name>.location` (a file) or `<name>.pem` (inline)."""
    location, inline = merged.get(f"{name}.location"), merged.get(f"{name}.pem")
    if location is not None and inline is not None:
        raise KafkaSettingError(
            where(f"{name}.pem"), f"give {name}.location or {name}.pem, not both"
        )
    if inline is not None:
        return f"{name}.pem", inline
    if location is not None:
        setting = f"{name}.location"
        return setting, _read(Path(location).expanduser(), where(setting))
    return None


def _private_key(text: str, setting: str) -> str:
    """The first private key in `text`, which Java reads only in PKCS#8 form."""
    for label, block in _labelled_blocks(text):
        if label in ("PRIVATE KEY", "ENCRYPTED PRIVATE KEY"):
            return block
        if label.endswith("PRIVATE KEY"):
            raise KafkaSettingError(
                setting,
                f"holds a {label} (PKCS#1 or SEC1); Java's PEM key store reads PKCS#8 only: "
                "convert it with openssl pkcs8 -topk8",
            )
    raise KafkaSettingError(setting, "holds no PEM private key")


def _warn_if_pbes2(block: str, setting: str) -> None:
    """OpenSSL 3 encrypts PKCS#8 keys with PBES2 by default, which Java 17's PEM key
    store cannot decrypt; say so now rather than leave a Java stack trace to explain it."""
    body = "".join(line for line in block.splitlines()[1:-1] if ":" not in line)
    try:
        der = base64.b64decode(body, validate=False)
    except (binascii.Error, ValueError):
        return
    if _PBES2_OID in der[:40]:
        log.warning(
            "%s is encrypted with PBES2, which the PEM key store of older Java versions "
            "(17 among them) cannot decrypt; if Spark reports 'PBES2 SecretKeyFactory not "
            "available', re-encrypt it with openssl pkcs8 -topk8 -v1 PBE-SHA1-3DES",
            setting,
        )


def _labelled_blocks(text: str) -> Iterable[tuple[str, str]]:
    for match in _PEM_BLOCK.finditer(text):
        yield match.group(1), match.group(0)


def _blocks(text: str, label: str) -> list[str]:
    return [block for found, block in _labelled_blocks(text) if found == label]


def _read(path: Path, setting: str) -> str:
    try:
        return path.read_text(encoding="ascii", errors="replace")
    except OSError as exc:
        raise KafkaSettingError(setting, f"cannot read {path}: {exc.strerror}") from None
