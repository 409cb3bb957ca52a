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

This module decides what each key is; what the SASL and SSL keys become (a JAAS line,
PEM key and trust stores) is built in `kafka_security`, with the error that refuses a key.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any

from delayservice.audit.kafka_security import (
    SASL_CREDENTIALS,
    SSL_HANDLED,
    KafkaSettingError,
    sasl_options,
    ssl_options,
)
from delayservice.settings import Settings

log = logging.getLogger(__name__)

PREFIX = "kafka."
"""Spark hands options with this prefix, stripped, to the Java Kafka client."""

MASK = "***"

SENSITIVE = ("password", "secret", "jaas", "key", "token", "credential", "certificate")
"""Key fragments whose values are not shown. Deliberately broad: masking a keystore's
path or type costs a little readability, showing one secret costs a rotation.
Certificates are public but are long PEM blocks that add nothing to a log line."""

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
        out |= sasl_options(merged, where, has_jaas=f"{PREFIX}sasl.jaas.config" in wanted)
    if uses_ssl:
        out |= ssl_options(merged, where)
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
