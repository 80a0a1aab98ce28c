import pytest
from rest_framework.test import APIClient

from openrelay.core.models import ApiKey


def _get(client, **headers):
    return client.get("/v1/batches", **headers)


@pytest.mark.django_db
class TestAuth:
    def test_it_refuses_missing_header(self):
        response = APIClient().get("/v1/batches")
        assert response.status_code == 401
        assert response.json()["error"]["type"] == "authentication_error"
        assert response.json()["error"]["code"] == "missing_api_key"

    def test_it_refuses_wrong_scheme(self, alice):
        response = APIClient().get("/v1/batches", HTTP_AUTHORIZATION=f"Basic {alice.key}")
        assert response.status_code == 401
        assert "Bearer" in response.json()["error"]["message"]

    def test_it_refuses_unknown_key(self, alice):
        response = APIClient().get("/v1/batches", HTTP_AUTHORIZATION=f"Bearer {alice.key[:-2]}xx")
        assert response.status_code == 401
        assert response.json()["error"]["code"] == "invalid_api_key"

    def test_it_refuses_non_openrelay_token(self):
        response = APIClient().get("/v1/batches", HTTP_AUTHORIZATION="Bearer sk-abc")
        assert response.status_code == 401

    def test_it_refuses_revoked_key(self, alice):
        ApiKey.objects.get(organization=alice.org).revoke()
        response = alice.client.get("/v1/batches")
        assert response.status_code == 401

    def test_a_known_key_revoked_in_this_process_is_refused_at_once(self, alice):
        assert alice.client.get("/v1/batches").status_code == 200  # the key is now known for 5 s
        ApiKey.objects.get(organization=alice.org).revoke()
        assert alice.client.get("/v1/batches").status_code == 401

    def test_a_known_key_is_read_again_after_the_cache_time(self, alice, settings, django_assert_num_queries):
        # A revoke in another process (a row changed under this one) counts once the cache time passes.
        alice.client.get("/v1/batches")
        ApiKey.objects.filter(organization=alice.org).update(revoked_at="2026-01-01T00:00:00Z")  # no signal
        assert alice.client.get("/v1/batches").status_code == 200  # within the cache time
        settings.OPENRELAY_API_KEY_CACHE_S = 0
        assert alice.client.get("/v1/batches").status_code == 401

    def test_an_organizations_change_is_seen_at_once(self, alice):
        from openrelay.core import auth

        alice.client.get("/v1/batches")
        alice.org.workflows_enabled = True
        alice.org.save(update_fields=["workflows_enabled"])
        assert auth._known == {}  # emptied: the next request reads the key and its organization again

    def test_it_accepts_good_key_and_updates_last_used(self, alice):
        key = ApiKey.objects.get(organization=alice.org)
        assert key.last_used_at is None
        response = alice.client.get("/v1/batches")
        assert response.status_code == 200
        key.refresh_from_db()
        assert key.last_used_at is not None

    def test_it_stores_no_plaintext_key(self, alice):
        key = ApiKey.objects.get(organization=alice.org)
        stored = " ".join(str(v) for v in ApiKey.objects.filter(pk=key.pk).values_list().get())
        assert alice.key not in stored
        assert key.hashed != alice.key and len(key.hashed) == 64
