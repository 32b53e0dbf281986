"""X.509 certificates of a cross-silo deployment (``runtime=grpc``): a CA the deployment chooses
signs one certificate per party (name ``party-<m>``) and one for the server; TLS authenticates
both ends with them, and each party signs its X25519 key of a run with its certificate's key, so
its peers verify the key against the CA and the party's name (the server relays, and cannot
substitute one). :func:`write_development_ca` makes a CA and every certificate for tests and the
quick start. Certificate arithmetic is the ``cryptography`` package's (ECDSA P-256, SHA-256)."""

from __future__ import annotations

import datetime
import os
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
from cryptography.x509.verification import PolicyBuilder, Store, VerificationError

from vfl_lightning.errors import RunFailure
from vfl_lightning.mechanisms.identity import signed_message
from vfl_lightning.mechanisms.keys import party_pair_seeds

SERVER_NAME = "vfl-server"
"""The name the development CA gives the server's certificate (a deployment may choose another:
each party's configuration names the server it accepts)."""
CA_FILE = "ca.pem"
VALID_DAYS = 365


class CertificateConfigError(ValueError):
    """A certificate or key file that cannot be used (names the file and what is wrong)."""


class KeyCertificationError(RunFailure):
    """A relayed public key failed its certificate check: the message names the party."""


def party_name(party: int) -> str:
    """The name party ``party``'s certificate carries (subject alternative name and CN)."""
    return f"party-{int(party)}"


def party_files(party: int) -> tuple[str, str]:
    """(certificate, key) file names of party ``party`` in a development CA's directory."""
    return f"party_{int(party)}.pem", f"party_{int(party)}.key"


# ----------------------------------------------------------------------------- making certificates
def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def make_ca(common_name: str = "vfl_lightning development CA", days: int = VALID_DAYS):
    """(key, certificate) of a new self-signed CA."""
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.timezone.utc)
    subject = _name(common_name)
    public = key.public_key()
    certificate = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(public)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=False,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(public), critical=False)
        .sign(key, hashes.SHA256())
    )
    return key, certificate


def issue_certificate(ca_key, ca_certificate: x509.Certificate, name: str, days: int = VALID_DAYS):
    """(key, certificate) for ``name`` signed by the CA: usable as a TLS server and client
    certificate and to sign key-agreement messages."""
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.timezone.utc)
    ca_identifier = ca_certificate.extensions.get_extension_for_class(x509.SubjectKeyIdentifier)
    certificate = (
        x509.CertificateBuilder()
        .subject_name(_name(name))
        .issuer_name(ca_certificate.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=days))
        .add_extension(x509.SubjectAlternativeName([x509.DNSName(name)]), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=True,
                key_cert_sign=False,
                crl_sign=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(
            x509.ExtendedKeyUsage(
                [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]
            ),
            critical=False,
        )
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(ca_identifier.value),
            critical=False,
        )
        .sign(ca_key, hashes.SHA256())
    )
    return key, certificate


def _write(path: Path, data: bytes, private: bool) -> None:
    if private:
        descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(descriptor, "wb") as stream:
            stream.write(data)
        os.chmod(path, 0o600)
    else:
        path.write_bytes(data)


def key_pem(key) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def certificate_pem(certificate: x509.Certificate) -> bytes:
    return certificate.public_bytes(serialization.Encoding.PEM)


def write_development_ca(
    out: Path, num_parties: int, *, server_name: str = SERVER_NAME, days: int = VALID_DAYS
) -> list[Path]:
    """A new CA in ``out`` (``ca.pem``, ``ca.key``) and its certificates: ``server.pem`` /
    ``server.key`` named ``server_name``, ``party_<m>.pem`` / ``party_<m>.key`` named
    ``party-<m>``; keys readable by their owner only. Returns the files written."""
    out.mkdir(parents=True, exist_ok=True)
    ca_key, ca_certificate = make_ca(days=days)
    written = []

    def save(stem: str, key, certificate) -> None:
        for suffix, data, private in (
            (".pem", certificate_pem(certificate), False),
            (".key", key_pem(key), True),
        ):
            path = out / f"{stem}{suffix}"
            _write(path, data, private)
            written.append(path)

    save("ca", ca_key, ca_certificate)
    save("server", *issue_certificate(ca_key, ca_certificate, server_name, days))
    for party in range(num_parties):
        save(f"party_{party}", *issue_certificate(ca_key, ca_certificate, party_name(party), days))
    return written


# ----------------------------------------------------------------------------- reading
def read_pem(path: str | Path, what: str) -> bytes:
    """The bytes of PEM file ``path`` (``what``: the setting that names it), or one
    :class:`CertificateConfigError`."""
    path = Path(path)
    try:
        data = path.read_bytes()
    except OSError as error:
        raise CertificateConfigError(
            f"{what}={path} cannot be read: {error.strerror or error}"
        ) from None
    if b"-----BEGIN" not in data:
        raise CertificateConfigError(f"{what}={path} is not a PEM file")
    return data


def load_certificate(data: bytes, what: str = "certificate") -> x509.Certificate:
    try:
        return x509.load_pem_x509_certificate(data)
    except ValueError as error:
        raise CertificateConfigError(f"{what} is not a PEM certificate: {error}") from None


def load_private_key(data: bytes, what: str = "key"):
    try:
        key = serialization.load_pem_private_key(data, password=None)
    except (ValueError, TypeError) as error:
        raise CertificateConfigError(
            f"{what} is not an unencrypted PEM private key: {error}"
        ) from None
    if not isinstance(key, ec.EllipticCurvePrivateKey):
        raise CertificateConfigError(f"{what} holds a {type(key).__name__}, not an EC key")
    return key


def certificate_names(certificate: x509.Certificate) -> list[str]:
    """The DNS names of the certificate's subject alternative name extension."""
    try:
        names = certificate.extensions.get_extension_for_class(x509.SubjectAlternativeName)
    except x509.ExtensionNotFound:
        return []
    return names.value.get_values_for_type(x509.DNSName)


@dataclass(frozen=True)
class Credentials:
    """One end's TLS material as PEM bytes: the CA it trusts, its certificate and key, and the
    name its certificate carries."""

    ca: bytes
    certificate: bytes
    key: bytes
    name: str

    @classmethod
    def from_files(
        cls, ca: str | Path, certificate: str | Path, key: str | Path, *, settings: tuple
    ) -> Credentials:
        """Read and check the three files (``settings``: the config keys that name them, for the
        messages): the certificate is the CA's and matches the key."""
        ca_pem, cert_pem, key_bytes = (
            read_pem(path, setting) for path, setting in zip((ca, certificate, key), settings)
        )
        ca_certificate = load_certificate(ca_pem, f"{settings[0]}={ca}")
        own = load_certificate(cert_pem, f"{settings[1]}={certificate}")
        private = load_private_key(key_bytes, f"{settings[2]}={key}")
        if own.public_key().public_numbers() != private.public_key().public_numbers():
            raise CertificateConfigError(
                f"{settings[2]}={key} is not the key of the certificate {settings[1]}={certificate}"
            )
        try:
            own.verify_directly_issued_by(ca_certificate)
        except (ValueError, TypeError, InvalidSignature):
            raise CertificateConfigError(
                f"{settings[1]}={certificate} is not signed by the CA {settings[0]}={ca}: use a "
                "certificate of the deployment's CA"
            ) from None
        names = certificate_names(own)
        if not names:
            raise CertificateConfigError(f"{settings[1]}={certificate} carries no DNS name")
        return cls(ca_pem, cert_pem, key_bytes, names[0])


# ----------------------------------------------------------------------------- certified keys
@dataclass(frozen=True)
class CertifiedKey:
    """What a party publishes for one run: its index, its X25519 public key (32 bytes), its
    certificate (PEM) and the ECDSA signature of :func:`signed_message` under the certificate's
    key. The server relays it."""

    party: int
    public_key: bytes
    certificate: bytes
    signature: bytes


def certify_key(
    credentials: Credentials, *, run_id: str, party: int, public_key: bytes
) -> CertifiedKey:
    """Party ``party``'s X25519 public key for run ``run_id``, signed with its certificate's key."""
    if len(public_key) != 32:
        raise ValueError(f"an X25519 public key has 32 bytes, got {len(public_key)}")
    key = load_private_key(credentials.key)
    signature = key.sign(signed_message(run_id, party, public_key), ec.ECDSA(hashes.SHA256()))
    return CertifiedKey(int(party), bytes(public_key), credentials.certificate, signature)


def verify_certified_key(certified: CertifiedKey, *, run_id: str, party: int, ca: bytes) -> bytes:
    """The X25519 public key of party ``party``, once its certificate verified against the CA
    ``ca`` (a chain to it, in its validity period, for client authentication) and names
    ``party-<party>``, and the signature verified for ``run_id``; else one
    :class:`KeyCertificationError` naming the party."""
    if certified.party != party:
        raise KeyCertificationError(
            f"the public key relayed as party {party}'s is signed for party {certified.party}: "
            "refused"
        )
    try:
        certificate = x509.load_pem_x509_certificate(certified.certificate)
    except ValueError:
        raise KeyCertificationError(
            f"party {party}'s relayed certificate is not a PEM certificate: its key is refused"
        ) from None
    store = Store(x509.load_pem_x509_certificates(ca))
    verifier = PolicyBuilder().store(store).build_client_verifier()
    try:
        verifier.verify(certificate, [])
    except VerificationError as error:
        raise KeyCertificationError(
            f"party {party}'s relayed certificate does not verify against this party's CA "
            f"({error}): its key is refused"
        ) from None
    expected = party_name(party)
    if expected not in certificate_names(certificate):
        raise KeyCertificationError(
            f"the certificate relayed for party {party} names {certificate_names(certificate)}, "
            f"not {expected}: its key is refused"
        )
    try:
        certificate.public_key().verify(
            certified.signature,
            signed_message(run_id, party, certified.public_key),
            ec.ECDSA(hashes.SHA256()),
        )
    except (InvalidSignature, TypeError, ValueError):
        raise KeyCertificationError(
            f"party {party}'s public key fails its certificate's signature for run {run_id!r}: "
            "it was substituted, replayed or tampered with; the run stops"
        ) from None
    return certified.public_key


def certified_pair_seeds(
    own, party: int, relayed: list[CertifiedKey], *, run_id: str, ca: bytes
) -> dict[tuple[int, int], int]:
    """Party ``party``'s pair seeds from the relayed keys (entry m: party m's), once every
    peer's certificate and signature verified; its own entry must carry its own key."""
    own_public = own.public_key().public_bytes(
        serialization.Encoding.Raw, serialization.PublicFormat.Raw
    )
    publics = []
    for index, certified in enumerate(relayed):
        if index == party:
            if certified.public_key != own_public:
                raise KeyCertificationError(
                    f"the key relayed as party {party}'s own is not the one it published: refused"
                )
            publics.append(own_public)
        else:
            publics.append(verify_certified_key(certified, run_id=run_id, party=index, ca=ca))
    return party_pair_seeds(own, party, publics)
