"""Spark's Kafka source options from the daemon's own librdkafka settings.

The settings file holds librdkafka keys (`kafka` for every client, `consumer` for
consumers), but Spark reads Kafka through the Java client, whose names differ and whose
security settings take other shapes: credentials go into one JAAS line, and a PEM
client certificate goes in as file contents, not as a path. Translating here lets one
config file serve the daemon and the audit, so an audit against a secured cluster needs
no second copy of the credentials that could drift from the first.

The translation is strict where a mistake costs security and lenient where it costs
nothing. A key that looks security-related and has no known translation stops the
audit: silently leaving it out could connect with weaker settings than the daemon's,
or fail later with a Java stack trace. librdkafka-only tuning keys (queue sizes, group
and commit behaviour) mean nothing to a batch read with assigned offsets; they are left
out with a warning. Messages and logs name keys and paths, never values.
"""

from __future__ import annotations

import base64
import binascii
import logging
import re
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from delayservice.audit import AuditError
from delayservice.errors import ConfigError, DelayServiceError
from delayservice.settings import Settings

log = logging.getLogger(__name__)

PREFIX = "kafka."
"""Spark hands options with this prefix, stripped, to the Java Kafka client."""

MASK = "***"

SENSITIVE = ("password", "secret", "jaas", "key", "token", "credential", "certificate")
"""Key fragments whose values are not shown. Deliberately broad: masking a keystore's
path or type costs a little readability, showing one secret costs a rotation.
Certificates are public but are long PEM blocks that add nothing to a log line."""

PLAIN_MODULE = "org.apache.kafka.common.security.plain.PlainLoginModule"
SCRAM_MODULE = "org.apache.kafka.common.security.scram.ScramLoginModule"
LOGIN_MODULES: Mapping[str, str] = {
    "PLAIN": PLAIN_MODULE,
    "SCRAM-SHA-256": SCRAM_MODULE,
    "SCRAM-SHA-512": SCRAM_MODULE,
}

ALIASES: Mapping[str, str] = {
    "sasl.mechanism": "sasl.mechanisms",
    "metadata.broker.list": "bootstrap.servers",
    "max.partition.fetch.bytes": "fetch.message.max.bytes",
}
"""librdkafka's alternative spellings, folded onto one name before `consumer` is laid
over `kafka`, so an alias in one section still overrides the other section's key."""

SAME_NAME = frozenset(
    {
        "bootstrap.servers",
        "client.id",
        "client.rack",
        "client.dns.lookup",
        "metadata.max.age.ms",
        "socket.connection.setup.timeout.ms",
        "connections.max.idle.ms",
        "reconnect.backoff.ms",
        "reconnect.backoff.max.ms",
        "retry.backoff.ms",
        "retry.backoff.max.ms",
        "fetch.min.bytes",
        "fetch.max.bytes",
        "isolation.level",
        "check.crcs",
        "allow.auto.create.topics",
        "enable.metrics.push",
        "security.protocol",
        "sasl.kerberos.service.name",
    }
)
"""Keys both clients know under this name, with the same meaning and value syntax."""

RENAMED: Mapping[str, str] = {
    "fetch.wait.max.ms": "fetch.max.wait.ms",
    "fetch.message.max.bytes": "max.partition.fetch.bytes",
}
"""Same meaning and value syntax, another name in the Java client."""

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

NEEDS_JAAS_CONFIG = (
    "sasl.kerberos.principal",
    "sasl.kerberos.keytab",
    "sasl.kerberos.kinit.cmd",
    "sasl.kerberos.min.time.before.relogin",
    "sasl.oauthbearer.",
    "enable.sasl.oauthbearer.unsecure.jwt",
)
"""Keys (or prefixes) whose Java counterpart lives inside a JAAS line this module cannot
write; an explicit `--kafka-option sasl.jaas.config=...` takes their place."""

_SECURITY_PREFIXES = ("ssl.", "sasl.", "security.", "https.")
_SECURITY_WORDS = (
    "password",
    "secret",
    "token",
    "credential",
    "jaas",
    "key",
    "cert",
    "oauth",
    "kerberos",
    "crl",
    "cipher",
    "trust",
)

KEYSTORE_GROUP = frozenset(
    {
        "ssl.keystore.type",
        "ssl.keystore.location",
        "ssl.keystore.password",
        "ssl.keystore.certificate.chain",
        "ssl.keystore.key",
        "ssl.key.password",
    }
)
TRUSTSTORE_GROUP = frozenset(
    {
        "ssl.truststore.type",
        "ssl.truststore.location",
        "ssl.truststore.password",
        "ssl.truststore.certificates",
    }
)
GROUPS = (KEYSTORE_GROUP, TRUSTSTORE_GROUP)
"""Java keys that only make sense together: an explicit option for one of them replaces
the whole translated group, so a JKS truststore given on the command line does not
inherit `ssl.truststore.type=PEM` from the translation."""

_PEM_BLOCK = re.compile(r"-----BEGIN ([A-Z0-9 ]+)-----\r?\n.*?-----END \1-----", re.DOTALL)
_PBES2_OID = bytes.fromhex("06092a864886f70d01050d")  # 1.2.840.113549.1.5.13


class KafkaSettingError(AuditError, ConfigError):
    """A Kafka setting the audit cannot hand to Spark. A ConfigError too, so the CLI
    exits 2 (bad settings) before Spark starts; the message names the key, never its value."""

    def __init__(self, setting: str, problem: str) -> None:
        DelayServiceError.__init__(self, f"setting {setting}: {problem}")
        self.setting = setting


def is_sensitive(key: str) -> bool:
    """True when the value of `key` must not be shown (see SENSITIVE)."""
    lowered = key.lower()
    return any(word in lowered for word in SENSITIVE)


def masked(options: Mapping[str, str]) -> dict[str, str]:
    """A copy fit for logs and progress lines: sensitive values replaced by `***`."""
    return {key: MASK if is_sensitive(key) else value for key, value in options.items()}


def describe(options: Mapping[str, str]) -> str:
    """One progress line's worth: `key=value, ...` without the prefix, values masked."""
    if not options:
        return "none (the Java client's defaults: PLAINTEXT)"
    shown = masked(options)
    return ", ".join(f"{key.removeprefix(PREFIX)}={shown[key]}" for key in sorted(shown))


def prefixed(options: Mapping[str, str]) -> dict[str, str]:
    """Keys as Spark's Kafka source wants them; `kafka.` added where it is missing."""
    return {
        (key if key.startswith(PREFIX) else f"{PREFIX}{key}"): value
        for key, value in options.items()
    }


def librdkafka_settings(settings: Settings) -> tuple[Mapping[str, Any], Mapping[str, Any]]:
    """The two sections a consumer of the daemon is built from, weakest first."""
    return settings.kafka, settings.consumer


def spark_options(
    settings: Settings, explicit: Mapping[str, str], *, from_settings: bool = True
) -> dict[str, str]:
    """What the audit hands Spark's Kafka source: the settings file's keys translated
    (unless `from_settings` is off), with the explicit `--kafka-option` pairs on top."""
    if not from_settings:
        return prefixed(explicit)
    kafka, consumer = librdkafka_settings(settings)
    return translate(kafka, consumer, explicit=explicit)


def translate(
    kafka: Mapping[str, Any],
    consumer: Mapping[str, Any] | None = None,
    *,
    explicit: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """librdkafka settings (`consumer` laid over `kafka`) as `kafka.`-prefixed Java client
    options for Spark's Kafka source, with `explicit` (Java names) winning.

    Raises KafkaSettingError for a security-related key it cannot translate, unless an
    explicit option takes its place; warns about the other keys it leaves out.
    """
    wanted = prefixed(explicit or {})
    merged, where = _merge(kafka, consumer or {})
    protocol = (
        (wanted.get(f"{PREFIX}security.protocol") or merged.get("security.protocol") or "PLAINTEXT")
        .strip()
        .upper()
    )
    uses_ssl, uses_sasl = protocol.endswith("SSL"), protocol.startswith("SASL")
    out: dict[str, str] = {}
    unused, dropped = [], []
    for key, value in merged.items():
        kind = _kind(key, uses_ssl=uses_ssl, uses_sasl=uses_sasl)
        if kind == "direct":
            out[RENAMED.get(key, key)] = (
                value.strip().upper() if key == "security.protocol" else value
            )
        elif kind == "unused":
            unused.append(key)
        elif kind == "dropped":
            dropped.append(key)
        elif kind == "jaas" and f"{PREFIX}sasl.jaas.config" not in wanted:
            raise KafkaSettingError(
                where(key),
                "its Java counterpart lives in a JAAS line the audit cannot write; "
                "give one with --kafka-option sasl.jaas.config=...",
            )
        elif kind == "security" and f"{PREFIX}{key}" not in wanted:
            raise KafkaSettingError(
                where(key),
                "no known equivalent in the Java client Spark reads Kafka with; give the "
                "Java setting with --kafka-option, or use --no-kafka-settings and give all "
                "Kafka client settings with --kafka-option",
            )
    if unused:
        log.info(
            "kafka settings not used with security.protocol=%s, left out: %s",
            protocol,
            ", ".join(sorted(unused)),
        )
    if dropped:
        log.warning(
            "kafka settings without an equivalent in Spark's Kafka source, left out of the "
            "audit: %s",
            ", ".join(sorted(dropped)),
        )
    if uses_sasl:
        out |= _sasl(merged, where, has_jaas=f"{PREFIX}sasl.jaas.config" in wanted)
    if uses_ssl:
        out |= _ssl(merged, where)
    translated = prefixed(out)
    for group in GROUPS:
        if any(key.removeprefix(PREFIX) in group for key in wanted):
            translated = {
                key: value
                for key, value in translated.items()
                if key.removeprefix(PREFIX) not in group
            }
    return translated | wanted


def _merge(
    kafka: Mapping[str, Any], consumer: Mapping[str, Any]
) -> tuple[dict[str, str], Callable[[str], str]]:
    """`consumer` laid over `kafka`, and a function naming the section a key came from,
    so an error points at the line of the settings file to change."""
    first, second = _folded(kafka), _folded(consumer)
    section = {key: "kafka" for key in first} | {key: "consumer" for key in second}

    def where(key: str) -> str:
        return f"{section.get(key, 'kafka')}.{key}"

    return first | second, where


def _kind(key: str, *, uses_ssl: bool, uses_sasl: bool) -> str:
    """How `translate` treats a key: direct (same or renamed), grouped (translated with
    others below), unused (for this protocol), jaas or security (an error unless an
    explicit option replaces it), or dropped (harmless to leave out)."""
    if (_is_ssl(key) and not uses_ssl) or (_is_sasl(key) and not uses_sasl):
        return "unused"
    if key in SAME_NAME or key in RENAMED:
        return "direct"
    if key in SSL_HANDLED or key in SASL_CREDENTIALS or key == "sasl.mechanisms":
        return "grouped"
    if _needs_jaas(key):
        return "jaas"
    if _looks_security_related(key):
        return "security"
    return "dropped"


def _folded(section: Mapping[str, Any]) -> dict[str, str]:
    """Aliases folded onto one name, values as strings (TOML may give booleans or ints)."""
    out: dict[str, str] = {}
    for key, value in section.items():
        text = ("true" if value else "false") if isinstance(value, bool) else str(value)
        out[ALIASES.get(key, key)] = text
    return out


def _is_ssl(key: str) -> bool:
    return key.startswith("ssl.") or key == "enable.ssl.certificate.verification"


def _is_sasl(key: str) -> bool:
    return key.startswith("sasl.") or key == "enable.sasl.oauthbearer.unsecure.jwt"


def _needs_jaas(key: str) -> bool:
    return any(
        key.startswith(entry) if entry.endswith(".") else key == entry
        for entry in NEEDS_JAAS_CONFIG
    )


def _looks_security_related(key: str) -> bool:
    lowered = key.lower()
    return lowered.startswith(_SECURITY_PREFIXES) or any(w in lowered for w in _SECURITY_WORDS)


def jaas_quote(value: str) -> str:
    """A double-quoted JAAS option value. The Java client parses JAAS with
    StreamTokenizer, which reads backslash escapes inside quotes and ends a quoted value
    at a raw line break (then reports the rest of the password as an unknown option), so
    backslashes, quotes and line breaks are all escaped."""
    escaped = (
        value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n").replace("\r", "\\r")
    )
    return f'"{escaped}"'


def _sasl(
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


def _ssl(merged: Mapping[str, str], where: Callable[[str], str]) -> dict[str, str]:
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
