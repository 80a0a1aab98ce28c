import pytest


@pytest.mark.django_db
class TestHosts:
    def test_one_host_serves_everything_by_default(self, alice):
        assert alice.client.get("/v1/batches", HTTP_HOST="anything.local").status_code == 200

    def test_control_plane_answers_404(self, alice, settings):
        settings.OPENRELAY_INFERENCE_HOSTS = ["inference.openrelay.inc"]
        settings.OPENRELAY_CONTROL_HOSTS = ["api.openrelay.inc"]
        for path in ("/v1/batches", "/v1/files", "/v1/webhook_endpoints", "/v1/webhook_event_types"):
            response = alice.client.get(path, HTTP_HOST="api.openrelay.inc")
            assert response.status_code == 404
            assert response.json()["error"]["type"] == "not_found_error"
            assert "inference host" in response.json()["error"]["message"]

    def test_inference_host_serves_batch_routes(self, alice, settings):
        settings.OPENRELAY_INFERENCE_HOSTS = ["inference.openrelay.inc"]
        settings.OPENRELAY_CONTROL_HOSTS = ["api.openrelay.inc"]
        assert alice.client.get("/v1/batches", HTTP_HOST="inference.openrelay.inc").status_code == 200
        assert alice.client.get("/v1/files", HTTP_HOST="inference.openrelay.inc:443").status_code == 200
        assert alice.client.get("/v1/webhook_endpoints", HTTP_HOST="inference.openrelay.inc").status_code == 200

    def test_control_only_setting_refuses_only_control_hosts(self, alice, settings):
        settings.OPENRELAY_CONTROL_HOSTS = ["api.openrelay.inc"]
        assert alice.client.get("/v1/batches", HTTP_HOST="api.openrelay.inc").status_code == 404
        assert alice.client.get("/v1/batches", HTTP_HOST="other.local").status_code == 200

    def test_control_host_still_serves_admin(self, client, settings):
        settings.OPENRELAY_INFERENCE_HOSTS = ["inference.openrelay.inc"]
        assert client.get("/admin/login/", HTTP_HOST="api.openrelay.inc").status_code == 200
