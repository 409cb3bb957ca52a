"""The audit's Kafka settings: librdkafka keys from the settings file in the Java client's terms.

Most tests here are plain Python on the translation table. Two check the result where it
counts: the Java Kafka client Spark ships builds a consumer from the translated SASL and
SSL options (PEM files made by openssl, a key password and a SASL password full of
quotes and backslashes), and a real Spark read on the PLAINTEXT test broker accepts what
the daemon's own consumer settings turn into, through the whole `delayservice audit`.
"""

from __future__ import annotations

import base64
import json
import logging
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from delayservice.audit import AuditError, extract, jars, session
from delayservice.audit.job import AuditOptions
from delayservice.audit.kafka_options import describe, masked, spark_options, translate
from delayservice.audit.kafka_security import (
    PLAIN_MODULE,
    SCRAM_MODULE,
    KafkaSettingError,
    jaas_quote,
)
from delayservice.cli.app import app
from delayservice.errors import ConfigError
from delayservice.settings_loading import load_settings

SECRET = 'pa"ss\\word'  # a password with both characters JAAS quoting must escape
CERT = "-----BEGIN CERTIFICATE-----\nMIIBcert\n-----END CERTIFICATE-----\n"
CA = "-----BEGIN CERTIFICATE-----\nMIIBca\n-----END CERTIFICATE-----\n"
KEY = "-----BEGIN PRIVATE KEY-----\nMIIEkey\n-----END PRIVATE KEY-----\n"
ENCRYPTED_KEY = (
    "-----BEGIN ENCRYPTED PRIVATE KEY-----\nMIIFencrypted\n-----END ENCRYPTED PRIVATE KEY-----\n"
)
SASL_SSL = {"security.protocol": "SASL_SSL"}


def jaas(module: str, username: str, password: str) -> str:
    return f"{module} required username={username} password={password};"


def write(path: Path, text: str) -> str:
    path.write_text(text)
    return str(path)


# --- the translation table -------------------------------------------------------------


def test_no_settings_give_no_options():
    assert translate({}, {}) == {}


def test_plain_credentials_become_a_jaas_line():
    options = translate(
        {
            "security.protocol": "sasl_plaintext",
            "sasl.mechanisms": "PLAIN",
            "sasl.username": "audit",
            "sasl.password": "secret",
        }
    )
    assert options == {
        "kafka.security.protocol": "SASL_PLAINTEXT",
        "kafka.sasl.mechanism": "PLAIN",
        "kafka.sasl.jaas.config": jaas(PLAIN_MODULE, '"audit"', '"secret"'),
    }


@pytest.mark.parametrize("mechanism", ["SCRAM-SHA-256", "SCRAM-SHA-512"])
def test_scram_credentials_use_the_scram_login_module(mechanism):
    options = translate(
        {**SASL_SSL, "sasl.mechanism": mechanism, "sasl.username": "u", "sasl.password": "p"}
    )
    assert options["kafka.sasl.mechanism"] == mechanism
    assert options["kafka.sasl.jaas.config"] == jaas(SCRAM_MODULE, '"u"', '"p"')


def test_quotes_backslashes_and_line_breaks_in_credentials_are_escaped():
    assert jaas_quote(SECRET) == '"pa\\"ss\\\\word"'
    assert jaas_quote("a\nb\rc") == '"a\\nb\\rc"'
    options = translate(
        {**SASL_SSL, "sasl.mechanisms": "PLAIN", "sasl.username": 'u"1', "sasl.password": SECRET}
    )
    assert options["kafka.sasl.jaas.config"] == jaas(PLAIN_MODULE, '"u\\"1"', '"pa\\"ss\\\\word"')


def test_consumer_keys_win_over_kafka_keys_even_under_an_alias():
    options = translate(
        {
            **SASL_SSL,
            "sasl.mechanisms": "PLAIN",
            "sasl.username": "u",
            "sasl.password": "old",
            "client.id": "every-client",
        },
        {"sasl.mechanism": "SCRAM-SHA-256", "sasl.password": "new", "client.id": "consumer"},
    )
    assert options["kafka.sasl.mechanism"] == "SCRAM-SHA-256"
    assert options["kafka.sasl.jaas.config"] == jaas(SCRAM_MODULE, '"u"', '"new"')
    assert options["kafka.client.id"] == "consumer"


def test_same_keys_pass_through_and_renamed_ones_take_the_java_name():
    options = translate(
        {"metadata.broker.list": "b1:9092", "client.id": "c", "client.rack": "r1"},
        {
            "fetch.wait.max.ms": "100",
            "max.partition.fetch.bytes": "1048576",
            "fetch.max.bytes": "8388608",
            "isolation.level": "read_committed",
        },
    )
    assert options == {
        "kafka.bootstrap.servers": "b1:9092",
        "kafka.client.id": "c",
        "kafka.client.rack": "r1",
        "kafka.fetch.max.wait.ms": "100",
        "kafka.max.partition.fetch.bytes": "1048576",
        "kafka.fetch.max.bytes": "8388608",
        "kafka.isolation.level": "read_committed",
    }


def test_toml_booleans_and_numbers_become_java_strings():
    options = translate({"check.crcs": True, "fetch.min.bytes": 1})
    assert options == {"kafka.check.crcs": "true", "kafka.fetch.min.bytes": "1"}


def test_librdkafka_only_keys_are_left_out_with_a_warning_naming_only_the_keys(caplog):
    with caplog.at_level(logging.WARNING):
        options = translate(
            {"statistics.interval.ms": "5000"},
            {
                "enable.auto.commit": "false",
                "auto.offset.reset": "earliest",
                "group.id": "group-value-xyz",
                "queued.max.messages.kbytes": "8192",
                "partition.assignment.strategy": "cooperative-sticky",
            },
        )
    assert options == {}
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    for key in ("enable.auto.commit", "auto.offset.reset", "group.id", "statistics.interval.ms"):
        assert key in warnings[0]
    assert "group-value-xyz" not in warnings[0]
    assert "cooperative-sticky" not in warnings[0]


def test_ssl_pem_files_become_a_pem_trust_store_and_key_store(tmp_path):
    ca = write(tmp_path / "ca.pem", CA)
    options = translate(
        {
            "security.protocol": "SSL",
            "ssl.ca.location": ca,
            "ssl.certificate.location": write(tmp_path / "client.pem", "Bag Attributes\n" + CERT),
            "ssl.key.location": write(tmp_path / "client.key", ENCRYPTED_KEY),
            "ssl.key.password": SECRET,
            "ssl.endpoint.identification.algorithm": "none",
        }
    )
    assert options == {
        "kafka.security.protocol": "SSL",
        "kafka.ssl.truststore.type": "PEM",
        "kafka.ssl.truststore.location": ca,
        "kafka.ssl.keystore.type": "PEM",
        "kafka.ssl.keystore.certificate.chain": CERT.strip(),
        "kafka.ssl.keystore.key": ENCRYPTED_KEY.strip(),
        "kafka.ssl.key.password": SECRET,
        "kafka.ssl.endpoint.identification.algorithm": "",
    }


def test_inline_pem_and_https_host_checks_translate_too():
    options = translate(
        {
            "security.protocol": "SASL_SSL",
            "ssl.ca.pem": CA,
            "ssl.certificate.pem": CERT,
            "ssl.key.pem": KEY,
            "ssl.endpoint.identification.algorithm": "https",
        }
    )
    assert options["kafka.ssl.truststore.certificates"] == CA.strip()
    assert "kafka.ssl.truststore.location" not in options
    assert options["kafka.ssl.keystore.certificate.chain"] == CERT.strip()
    assert options["kafka.ssl.keystore.key"] == KEY.strip()
    assert options["kafka.ssl.endpoint.identification.algorithm"] == "https"


def test_a_password_for_a_plain_key_is_left_out_because_java_fails_on_it(tmp_path):
    options = translate(
        {
            "security.protocol": "SSL",
            "ssl.certificate.location": write(tmp_path / "c.pem", CERT),
            "ssl.key.location": write(tmp_path / "k.pem", KEY),
            "ssl.key.password": SECRET,
        }
    )
    assert options["kafka.ssl.keystore.key"] == KEY.strip()
    assert "kafka.ssl.key.password" not in options


def test_a_pkcs12_key_store_keeps_its_path_and_password():
    options = translate(
        {
            "security.protocol": "SSL",
            "ssl.keystore.location": "/etc/kafka/client.p12",
            "ssl.keystore.password": SECRET,
        }
    )
    assert options == {
        "kafka.security.protocol": "SSL",
        "kafka.ssl.keystore.type": "PKCS12",
        "kafka.ssl.keystore.location": "/etc/kafka/client.p12",
        "kafka.ssl.keystore.password": SECRET,
    }


def test_a_pbes2_encrypted_key_gets_a_warning_with_the_fix(tmp_path, caplog):
    der = bytes.fromhex("308201003057" + "06092a864886f70d01050d") + bytes(40)
    body = base64.b64encode(der).decode()
    key = f"-----BEGIN ENCRYPTED PRIVATE KEY-----\n{body}\n-----END ENCRYPTED PRIVATE KEY-----\n"
    settings = {
        "security.protocol": "SSL",
        "ssl.certificate.pem": CERT,
        "ssl.key.location": write(tmp_path / "k.pem", key),
        "ssl.key.password": SECRET,
    }
    with caplog.at_level(logging.WARNING):
        translate(settings)
    assert any("PBES2" in r.getMessage() for r in caplog.records)
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        translate({**settings, "ssl.key.location": write(tmp_path / "v1.pem", ENCRYPTED_KEY)})
    assert not any("PBES2" in r.getMessage() for r in caplog.records)


def test_ssl_keys_are_unused_without_ssl_and_sasl_keys_without_sasl(tmp_path):
    missing = str(tmp_path / "nowhere.pem")
    assert translate(
        {"security.protocol": "PLAINTEXT", "ssl.ca.location": missing, "sasl.password": "x"}
    ) == {"kafka.security.protocol": "PLAINTEXT"}
    # An explicit protocol decides what is used, as it is what the client will speak.
    with pytest.raises(KafkaSettingError, match=r"ssl\.ca\.location"):
        translate({"ssl.ca.location": missing}, explicit={"security.protocol": "SSL"})


def test_ssl_ca_location_probe_means_the_jvm_default_trust_store():
    assert translate({"security.protocol": "SSL", "ssl.ca.location": "probe"}) == {
        "kafka.security.protocol": "SSL"
    }


# --- what cannot be translated ---------------------------------------------------------


ERRORS = [
    ({**SASL_SSL, "ssl.crl.location": "/etc/crl.pem"}, "kafka.ssl.crl.location"),
    ({**SASL_SSL, "ssl.cipher.suites": "ECDHE-RSA-AES256-GCM-SHA384"}, "kafka.ssl.cipher.suites"),
    ({**SASL_SSL, "sasl.kerberos.keytab": "/etc/krb5.keytab"}, "kafka.sasl.kerberos.keytab"),
    (
        {**SASL_SSL, "sasl.oauthbearer.client.secret": SECRET},
        "kafka.sasl.oauthbearer.client.secret",
    ),
    ({"https.ca.location": "/etc/ca.pem"}, "kafka.https.ca.location"),
    ({**SASL_SSL, "enable.ssl.certificate.verification": "false"}, "certificate checks"),
    ({**SASL_SSL, "ssl.endpoint.identification.algorithm": "dns"}, "none or https"),
    (
        {**SASL_SSL, "sasl.mechanisms": "GSSAPI", "sasl.username": "u", "sasl.password": SECRET},
        "kafka.sasl.password",
    ),
    ({**SASL_SSL, "sasl.mechanisms": "PLAIN", "sasl.password": SECRET}, "needs sasl.username"),
    ({**SASL_SSL, "ssl.key.pem": KEY}, "needs ssl.certificate.location"),
    ({**SASL_SSL, "ssl.certificate.pem": CERT, "ssl.key.pem": ENCRYPTED_KEY}, "ssl.key.password"),
    (
        {
            **SASL_SSL,
            "ssl.certificate.pem": CERT,
            "ssl.key.pem": KEY.replace("PRIVATE KEY", "RSA PRIVATE KEY"),
        },
        "PKCS#8",
    ),
    ({**SASL_SSL, "ssl.ca.pem": "not a certificate " + SECRET}, "holds no PEM certificate"),
    (
        {**SASL_SSL, "ssl.keystore.location": "/k.p12", "ssl.certificate.pem": CERT},
        "not both",
    ),
]


@pytest.mark.parametrize(("settings", "named"), ERRORS)
def test_security_settings_it_cannot_translate_stop_the_audit_in_one_line(settings, named):
    with pytest.raises(KafkaSettingError) as caught:
        translate(settings)
    message = str(caught.value)
    assert named in message
    assert "\n" not in message
    assert SECRET not in message
    assert isinstance(caught.value, AuditError)
    assert isinstance(caught.value, ConfigError)  # the CLI exits 2: bad settings


def test_errors_name_the_section_the_key_came_from():
    with pytest.raises(KafkaSettingError, match=r"setting consumer\.ssl\.crl\.location"):
        translate(SASL_SSL, {"ssl.crl.location": "/etc/crl.pem"})


def test_unreadable_pem_files_are_named_by_path(tmp_path):
    with pytest.raises(KafkaSettingError, match=r"cannot read .*nowhere\.pem"):
        translate({"security.protocol": "SSL", "ssl.ca.location": str(tmp_path / "nowhere.pem")})
    with pytest.raises(KafkaSettingError, match="is a folder"):
        translate({"security.protocol": "SSL", "ssl.ca.location": str(tmp_path)})


def test_an_explicit_java_option_takes_the_place_of_what_cannot_be_translated():
    settings = {
        **SASL_SSL,
        "sasl.mechanisms": "GSSAPI",
        "sasl.kerberos.service.name": "kafka",
        "sasl.kerberos.keytab": "/etc/krb5.keytab",
        "ssl.cipher.suites": "ECDHE-RSA-AES256-GCM-SHA384",
    }
    krb5 = 'com.sun.security.auth.module.Krb5LoginModule required keyTab="/etc/krb5.keytab";'
    options = translate(
        settings,
        explicit={
            "sasl.jaas.config": krb5,
            "kafka.ssl.cipher.suites": "TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384",
        },
    )
    assert options == {
        "kafka.security.protocol": "SASL_SSL",
        "kafka.sasl.mechanism": "GSSAPI",
        "kafka.sasl.kerberos.service.name": "kafka",
        "kafka.sasl.jaas.config": krb5,
        "kafka.ssl.cipher.suites": "TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384",
    }


def test_explicit_options_win_and_replace_a_whole_key_or_trust_store(tmp_path):
    settings = {
        **SASL_SSL,
        "client.id": "from-settings",
        "sasl.mechanisms": "PLAIN",
        "sasl.username": "u",
        "sasl.password": "p",
        "ssl.ca.location": write(tmp_path / "ca.pem", CA),
        "ssl.certificate.pem": CERT,
        "ssl.key.pem": KEY,
    }
    options = translate(
        settings,
        explicit={
            "client.id": "from-cli",
            "kafka.sasl.jaas.config": "explicit",
            "ssl.truststore.location": "/etc/kafka/truststore.jks",
            "ssl.truststore.password": "changeit",
        },
    )
    assert options["kafka.client.id"] == "from-cli"
    assert options["kafka.sasl.jaas.config"] == "explicit"
    # A JKS trust store from the command line must not inherit type=PEM from the settings.
    assert {k: v for k, v in options.items() if "truststore" in k} == {
        "kafka.ssl.truststore.location": "/etc/kafka/truststore.jks",
        "kafka.ssl.truststore.password": "changeit",
    }
    assert options["kafka.ssl.keystore.type"] == "PEM"  # the key store was not replaced


def test_the_audit_translates_the_settings_file_unless_told_not_to():
    settings = load_settings(
        kafka={**SASL_SSL, "sasl.mechanisms": "PLAIN", "sasl.username": "u", "sasl.password": "p"},
        consumer={"fetch.wait.max.ms": "100"},
        producer={"linger.ms": "50"},
    )
    options = spark_options(settings, {"client.id": "cli"})
    assert options["kafka.sasl.jaas.config"] == jaas(PLAIN_MODULE, '"u"', '"p"')
    assert options["kafka.fetch.max.wait.ms"] == "100"
    assert "kafka.linger.ms" not in options  # producer settings are not the audit's
    assert options["kafka.client.id"] == "cli"
    assert spark_options(settings, {"client.id": "cli"}, from_settings=False) == {
        "kafka.client.id": "cli"
    }


# --- secrets stay out of output ---------------------------------------------------------


def test_masked_hides_passwords_secrets_jaas_lines_and_keys():
    options = {
        "kafka.security.protocol": "SASL_SSL",
        "kafka.sasl.mechanism": "PLAIN",
        "kafka.sasl.jaas.config": "jaas-value",
        "kafka.ssl.key.password": "key-password-value",
        "kafka.ssl.keystore.key": "pem-key-value",
        "ssl.truststore.PASSWORD": "truststore-password-value",
        "kafka.sasl.oauthbearer.client.secret": "client-secret-value",
        "kafka.client.id": "audit",
    }
    shown = masked(options)
    assert shown == {
        "kafka.security.protocol": "SASL_SSL",
        "kafka.sasl.mechanism": "PLAIN",
        "kafka.sasl.jaas.config": "***",
        "kafka.ssl.key.password": "***",
        "kafka.ssl.keystore.key": "***",
        "ssl.truststore.PASSWORD": "***",
        "kafka.sasl.oauthbearer.client.secret": "***",
        "kafka.client.id": "audit",
    }
    assert options["kafka.sasl.jaas.config"] == "jaas-value"  # a copy, not in place
    line = describe(options)
    assert "sasl.jaas.config=***" in line
    assert "client.id=audit" in line
    assert "value" not in line
    assert describe({}).startswith("none")


def test_explicit_kafka_options_stay_out_of_the_repr():
    options = AuditOptions(kafka_options={"sasl.jaas.config": SECRET})
    assert SECRET not in repr(options)
    assert "sasl.jaas.config" not in repr(options)


def test_a_malformed_kafka_option_is_not_echoed_when_it_may_hold_a_secret(monkeypatch):
    monkeypatch.setattr(jars, "connector_jars", lambda *_: pytest.fail("Spark was prepared"))
    runner = CliRunner()
    hidden = runner.invoke(app, ["audit", "--kafka-option", f"sasl.password:{SECRET}"])
    assert hidden.exit_code == 2, hidden.output
    assert SECRET not in hidden.output
    assert "not key=value" in hidden.output
    shown = runner.invoke(app, ["audit", "--kafka-option", "client.id:audit"])
    assert shown.exit_code == 2, shown.output
    assert "client.id:audit" in shown.output


# --- the CLI's audit path ---------------------------------------------------------------


class FakeReader:
    """Records what `read_kafka` hands Spark's Kafka source, then stops the audit."""

    def __init__(self) -> None:
        self.options: dict[str, str] = {}
        self.formats: list[str] = []

    def format(self, name: str) -> FakeReader:
        self.formats.append(name)
        return self

    def option(self, key: str, value: str) -> FakeReader:
        self.options[key] = value
        return self

    def load(self) -> None:
        raise AuditError("the fake reader stops the audit here")


class FakeSpark:
    def __init__(self) -> None:
        self.read = FakeReader()
        self.stopped = False

    def stop(self) -> None:
        self.stopped = True


class FakeResolver:
    """Pins ten records on the first delay topic without asking a broker."""

    def __init__(self, *_: object, **__: object) -> None:
        pass

    def ranges(self, topics: list[str], **_: object) -> dict[str, dict[int, tuple[int, int]]]:
        return {topics[0]: {0: (0, 10)}}

    def close(self) -> None:
        pass


@pytest.fixture
def fake_spark(monkeypatch):
    spark = FakeSpark()
    monkeypatch.setattr(jars, "connector_jars", lambda *_: [])
    monkeypatch.setattr(session, "start", lambda *_, **__: spark)
    monkeypatch.setattr(extract, "OffsetResolver", FakeResolver)
    return spark


SECURED_CONFIG = """\
bootstrap_servers = "broker-1:9093"

[kafka]
"security.protocol" = "SASL_SSL"
"sasl.mechanisms" = "SCRAM-SHA-512"
"sasl.username" = "audit"
"sasl.password" = 'pa"ss\\word'
"ssl.ca.location" = "{ca}"

[consumer]
"fetch.wait.max.ms" = "100"
"enable.auto.commit" = "false"
"""


def test_the_cli_hands_translated_settings_to_sparks_kafka_reader(fake_spark, tmp_path):
    ca = write(tmp_path / "ca.pem", CA)
    config = tmp_path / "audit.toml"
    config.write_text(SECURED_CONFIG.format(ca=ca))
    result = CliRunner().invoke(
        app,
        [
            "audit",
            "--config",
            str(config),
            "--out",
            str(tmp_path / "out"),
            "--kafka-option",
            "client.id=audit-cli",
        ],
    )
    assert result.exit_code == 1, result.output
    assert "the fake reader stops the audit here" in result.output
    assert fake_spark.stopped
    assert fake_spark.read.formats == ["kafka"]
    seen = fake_spark.read.options
    assert {k: v for k, v in seen.items() if k.startswith("kafka.")} == {
        "kafka.bootstrap.servers": "broker-1:9093",
        "kafka.security.protocol": "SASL_SSL",
        "kafka.sasl.mechanism": "SCRAM-SHA-512",
        "kafka.sasl.jaas.config": jaas(SCRAM_MODULE, '"audit"', '"pa\\"ss\\\\word"'),
        "kafka.ssl.truststore.type": "PEM",
        "kafka.ssl.truststore.location": ca,
        "kafka.fetch.max.wait.ms": "100",
        "kafka.client.id": "audit-cli",
        # the delay topics, read as the daemon reads them
        "kafka.isolation.level": "read_committed",
    }
    assert seen["includeHeaders"] == "true"
    assert "sasl.jaas.config=***" in result.output  # the progress line, masked
    assert SECRET not in result.output
    assert "ScramLoginModule" not in result.output


def test_no_kafka_settings_hands_spark_only_the_explicit_options(fake_spark, tmp_path):
    config = tmp_path / "audit.toml"
    config.write_text(SECURED_CONFIG.format(ca=tmp_path / "absent.pem"))
    result = CliRunner().invoke(
        app,
        [
            "audit",
            "--config",
            str(config),
            "--no-kafka-settings",
            "--kafka-option",
            "security.protocol=SSL",
        ],
    )
    assert result.exit_code == 1, result.output
    assert {k for k in fake_spark.read.options if k.startswith("kafka.")} == {
        "kafka.bootstrap.servers",
        "kafka.security.protocol",
        "kafka.isolation.level",
    }


def test_an_untranslatable_setting_exits_2_before_spark_is_prepared(monkeypatch, tmp_path):
    monkeypatch.setattr(jars, "connector_jars", lambda *_: pytest.fail("Spark was prepared"))
    config = tmp_path / "audit.toml"
    config.write_text(
        '[kafka]\n"security.protocol" = "SASL_SSL"\n'
        '"sasl.oauthbearer.client.secret" = "client-secret-value"\n'
    )
    result = CliRunner().invoke(app, ["audit", "--config", str(config)])
    assert result.exit_code == 2, result.output
    assert "kafka.sasl.oauthbearer.client.secret" in result.output
    assert "client-secret-value" not in result.output


def test_help_says_the_settings_file_is_translated():
    result = CliRunner().invoke(app, ["audit", "--help"], env={"COLUMNS": "200"})
    assert result.exit_code == 0
    assert "translated from librdkafka" in result.output
    assert "--no-kafka-settings" in result.output


# --- the Java client and Spark accept the result ----------------------------------------

JAVA_CHECK = """
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.Base64;
import java.util.Map;
import java.util.Properties;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.common.config.types.Password;
import org.apache.kafka.common.security.JaasContext;
import org.apache.kafka.common.serialization.ByteArrayDeserializer;

/** Builds a consumer from base64 `key<TAB>value` lines (loading key and trust stores and
 * logging in), then prints the JAAS options as the client parsed them. */
public class CheckOptions {
  public static void main(String[] args) throws Exception {
    Properties props = new Properties();
    for (String line : Files.readAllLines(Path.of(args[0]))) {
      String[] kv = line.split("\\t", 2);
      props.put(kv[0], new String(Base64.getDecoder().decode(kv[1]), StandardCharsets.UTF_8));
    }
    props.putIfAbsent("bootstrap.servers", "127.0.0.1:1");
    props.put("key.deserializer", ByteArrayDeserializer.class.getName());
    props.put("value.deserializer", ByteArrayDeserializer.class.getName());
    try (var consumer = new KafkaConsumer<byte[], byte[]>(props)) {
      System.out.println("consumer built");
    }
    var jaas = props.getProperty("sasl.jaas.config");
    var entry = JaasContext.loadClientContext(Map.of("sasl.jaas.config", new Password(jaas)))
        .configurationEntries().get(0);
    System.out.println("module " + entry.getLoginModuleName());
    for (var name : new String[] {"username", "password"}) {
      var value = (String) entry.getOptions().get(name);
      System.out.println(name + " "
          + Base64.getEncoder().encodeToString(value.getBytes(StandardCharsets.UTF_8)));
    }
  }
}
"""


def openssl(command: str, *extra: str, cwd: Path) -> None:
    subprocess.run(
        ["openssl", *command.split(), *extra], cwd=cwd, check=True, capture_output=True, timeout=60
    )


@pytest.fixture(scope="module")
def pem_files(tmp_path_factory, unavailable):
    """A CA, a client certificate it signed, and the client key plain and encrypted
    (PBE-SHA1-3DES, which Java 17 can decrypt) with a password full of quotes."""
    if shutil.which("openssl") is None:
        unavailable("openssl is needed to make the test certificates")
    where = tmp_path_factory.mktemp("pem")
    openssl("req -x509 -newkey rsa:2048 -nodes -keyout ca.key -out ca.pem -subj /CN=ca", cwd=where)
    openssl("req -newkey rsa:2048 -nodes -keyout client.key -out client.csr -subj /CN=c", cwd=where)
    openssl("x509 -req -in client.csr -CA ca.pem -CAkey ca.key -out client.pem", cwd=where)
    openssl(
        "pkcs8 -topk8 -in client.key -out client.enc.key -v1 PBE-SHA1-3DES -passout",
        f"pass:{SECRET}",
        cwd=where,
    )
    return where


PASSWORD = 'p"a\\s\\"s\n\tw\\nörd'  # quotes, backslashes, a line break, a tab, "\n" as text


@pytest.mark.spark
@pytest.mark.parametrize(
    ("mechanism", "key", "module"),
    [
        ("SCRAM-SHA-512", "client.enc.key", SCRAM_MODULE),
        ("PLAIN", "client.key", PLAIN_MODULE),  # the key password must be left out for Java
    ],
)
def test_the_java_client_accepts_the_translated_sasl_ssl_options(
    spark_available, pem_files, tmp_path, mechanism, key, module
):
    options = translate(
        {
            "security.protocol": "sasl_ssl",
            "sasl.mechanisms": mechanism,
            "sasl.username": 'audit "user"',
            "sasl.password": PASSWORD,
            "ssl.ca.location": str(pem_files / "ca.pem"),
            "ssl.certificate.location": str(pem_files / "client.pem"),
            "ssl.key.location": str(pem_files / key),
            "ssl.key.password": SECRET,
            "ssl.endpoint.identification.algorithm": "none",
        }
    )
    lines = tmp_path / "options.txt"
    lines.write_text(
        "".join(
            f"{k.removeprefix('kafka.')}\t{base64.b64encode(v.encode()).decode()}\n"
            for k, v in options.items()
        )
    )
    source = tmp_path / "CheckOptions.java"
    source.write_text(JAVA_CHECK)
    classpath = [*map(str, jars.connector_jars()), str(jars.pyspark_jars_dir() / "*")]
    result = subprocess.run(
        ["java", "-cp", ":".join(classpath), str(source), str(lines)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    printed = dict(line.split(" ", 1) for line in result.stdout.splitlines() if " " in line)
    assert printed["consumer"] == "built"
    assert printed["module"] == module
    assert base64.b64decode(printed["username"]).decode() == 'audit "user"'
    assert base64.b64decode(printed["password"]).decode() == PASSWORD


AUDIT_CONFIG = """\
bootstrap_servers = "{bootstrap}"
levels = "1s,2s,3s"
topic_prefix = "{prefix}"

[kafka]
"security.protocol" = "plaintext"
"client.id" = "audit-{tag}"

[consumer]
"fetch.wait.max.ms" = "100"
"isolation.level" = "read_committed"
# Spark's Kafka source rejects the next two outright: the translation must leave them out.
"enable.auto.commit" = "false"
"auto.offset.reset" = "earliest"
"partition.assignment.strategy" = "cooperative-sticky"
"""


@pytest.mark.spark
@pytest.mark.kafka
@pytest.mark.long  # CI's audits of a real broker: test_audit_e2e and the isolation test
def test_a_real_audit_reads_the_plaintext_broker_with_the_daemons_consumer_settings(
    testbed, tmp_path
):
    settings = testbed.settings(partitions=1)
    testbed.create_delay_topics(settings)
    target = testbed.create_topic(f"orders-{testbed.tag}", partitions=1)
    producer = testbed.producer(settings)
    for i in range(3):
        producer.produce(target, f"v{i}".encode(), delay=1)
    assert producer.flush(10) == 0
    config = tmp_path / "audit.toml"
    config.write_text(
        AUDIT_CONFIG.format(
            bootstrap=testbed.bootstrap, prefix=settings.topic_prefix, tag=testbed.tag
        )
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("DELAYSERVICE_")}
    result = subprocess.run(
        [sys.executable, "-m", "delayservice", "audit", "--config", str(config),
         "--grace", "1h", "--out", str(tmp_path / "out")],
        env=env, capture_output=True, text=True, timeout=240, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    assert (
        "Kafka client settings for Spark: client.id=audit-"
        f"{testbed.tag}, fetch.max.wait.ms=100, isolation.level=read_committed, "
        "security.protocol=PLAINTEXT"
    ) in result.stderr
    assert (
        "left out of the audit: auto.offset.reset, enable.auto.commit, "
        "partition.assignment.strategy"
    ) in result.stderr
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["records_read"]["delay_topics"] == 3
    assert (summary["total"]["accepted"], summary["total"]["pending"]) == (3, 3)
