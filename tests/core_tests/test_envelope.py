import pytest
from django.test import override_settings
from django.urls import path
from rest_framework.decorators import api_view, authentication_classes, permission_classes
from rest_framework.test import APIClient


def _boom(request):
    raise RuntimeError("kaboom")


@api_view(["POST"])
@authentication_classes([])
@permission_classes([])
def _needs_int(request):
    from rest_framework import serializers

    class S(serializers.Serializer):
        count = serializers.IntegerField()

    S(data=request.data).is_valid(raise_exception=True)
    return None


urlpatterns = [path("v1/boom", _boom), path("v1/needs-int", _needs_int)]


def _assert_envelope(response, status):
    assert response.status_code == status
    assert response["Content-Type"].startswith("application/json")
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["message"]
    assert response["x-request-id"].startswith("req_")
    return error


@pytest.mark.django_db
class TestEnvelope:
    def test_it_answers_unknown_routes(self, alice):
        error = _assert_envelope(alice.client.get("/v1/nope"), 404)
        assert error["type"] == "not_found_error"

    def test_it_answers_405_saying_which_methods_the_route_serves(self, alice):
        response = alice.client.put("/v1/batches")
        error = _assert_envelope(response, 405)
        assert (error["type"], error["code"]) == ("invalid_request_error", "method_not_allowed")
        assert error["message"] == "Method PUT is not allowed on /v1/batches; it serves GET, POST."
        assert "POST" in response["Allow"]

    def test_it_answers_401(self):
        _assert_envelope(APIClient().get("/v1/files"), 401)

    def test_it_never_redirects_trailing_slash(self, alice):
        response = alice.client.post("/v1/batches/", {}, format="json")
        assert response.status_code == 404
        _assert_envelope(response, 404)

    @override_settings(ROOT_URLCONF=__name__)
    def test_it_answers_400_from_validation(self):
        error = _assert_envelope(APIClient().post("/v1/needs-int", {"count": "x"}, format="json"), 400)
        assert error["param"] == "count"
        assert error["type"] == "invalid_request_error"

    @override_settings(ROOT_URLCONF=__name__)
    def test_it_answers_500(self):
        client = APIClient(raise_request_exception=False)
        error = _assert_envelope(client.get("/v1/boom"), 500)
        assert error["type"] == "server_error"
        assert "kaboom" not in error["message"]

    def test_it_answers_413_for_oversized_json(self, alice, settings):
        settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 1024
        response = alice.client.post("/v1/batches", {"metadata": {"k": "v" * 5000}}, format="json")
        error = _assert_envelope(response, 413)
        assert error["code"] == "request_too_large"

    def test_every_response_has_request_id(self, alice):
        assert alice.client.get("/v1/batches")["x-request-id"].startswith("req_")
