from django.urls import path

from batches import views

# No trailing slashes: the OpenAI SDK requests /v1/batches/{id}/cancel exactly.
urlpatterns = [
    path("batches", views.BatchListView.as_view(), name="batch-list"),
    # What a batch may name and must keep, to be seen before submitting.
    path("models", views.ModelListView.as_view(), name="model-list"),
    path("models/<path:model_id>", views.ModelDetailView.as_view(), name="model-detail"),
    path("limits", views.LimitsView.as_view(), name="limits"),
    # OpenRelay's own: what a create with the same body would accept, cost and take, creating nothing.
    path("batches/estimate", views.BatchEstimateView.as_view(), name="batch-estimate"),
    path("batches/<str:batch_id>", views.BatchDetailView.as_view(), name="batch-detail"),
    path("batches/<str:batch_id>/cancel", views.BatchCancelView.as_view(), name="batch-cancel"),
    # OpenRelay's own: pause a running batch (it claims nothing) and resume it (batches.guardrails).
    path("batches/<str:batch_id>/pause", views.BatchPauseView.as_view(), name="batch-pause"),
    path("batches/<str:batch_id>/resume", views.BatchResumeView.as_view(), name="batch-resume"),
    # OpenRelay's own: a new batch of a finished batch's failed records.
    path("batches/<str:batch_id>/retry", views.BatchRetryView.as_view(), name="batch-retry"),
    # OpenRelay's own: the output or error lines of the records finished so far.
    path("batches/<str:batch_id>/results", views.BatchResultsView.as_view(), name="batch-results"),
]
