"""Dashboard fixtures: signed-in members of alice's and bob's organizations, storage in tmp_path."""

import orjson
import pytest
from django.utils import timezone

from batches.models import Batch
from files import services as file_services
from openrelay.core.models import Membership, Model

PASSWORD = "correct horse battery staple"
MODEL = "openrelay/gemma-4-31b"
CHAT = "/v1/chat/completions"


@pytest.fixture(autouse=True)
def _storage(tmp_storage):
    """Every dashboard test keeps its stored files in tmp_path."""


@pytest.fixture(autouse=True)
def _fast_passwords(settings):
    # PBKDF2's 1M rounds cost ~0.4 s a user; these passwords protect nothing.
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


def make_member(django_user_model, username, org):
    user = django_user_model.objects.create_user(username, password=PASSWORD)
    Membership.objects.create(user=user, organization=org)
    return user


@pytest.fixture
def alice_user(alice, django_user_model):
    return make_member(django_user_model, "alice", alice.org)


@pytest.fixture
def bob_user(bob, django_user_model):
    return make_member(django_user_model, "bob", bob.org)


@pytest.fixture
def alice_client(client, alice_user):
    client.force_login(alice_user)
    return client


@pytest.fixture
def gemma(db):
    return Model.objects.create(name=MODEL)


def chat_line(custom_id, content="hello", **extra):
    return {
        "custom_id": custom_id,
        "method": "POST",
        "url": CHAT,
        "body": {"model": MODEL, "messages": [{"role": "user", "content": content}]},
        **extra,
    }


def jsonl(*records):
    return b"".join((orjson.dumps(r) if isinstance(r, dict) else r) + b"\n" for r in records)


def stored_file(org, content=b'{"custom_id": "a"}\n', filename="in.jsonl", purpose="batch"):
    return file_services.create_file_from_chunks(
        organization=org,
        filename=filename,
        purpose=purpose,
        chunks=[content],
        expires_at=file_services.default_expiry(purpose),
    )


def make_batch(org, *, status="in_progress", total=10, completed=0, failed=0, input_file=None, **fields):
    """A batch row as the engine leaves it mid-way (no records: pages and sockets only read the roll-ups)."""
    file = input_file or stored_file(org)
    now = timezone.now()
    fields = {"endpoint": CHAT, "model_name": MODEL, **fields}
    return Batch.objects.create(
        organization=org,
        input_file=file,
        input_file_public_id=file.public_id,
        status=status,
        created_at=now,
        expires_at=now + timezone.timedelta(hours=24),
        in_progress_at=now if status != "validating" else None,
        total_count=total,
        completed_count=completed,
        failed_count=failed,
        **fields,
    )
