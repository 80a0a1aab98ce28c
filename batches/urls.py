from django.urls import path

from batches import views

# No trailing slashes: the OpenAI SDK requests /v1/batches/{id}/cancel exactly.
urlpatterns = [
    path("batches", views.BatchListView.as_view(), name="batch-list"),
    path("batches/<str:batch_id>", views.BatchDetailView.as_view(), name="batch-detail"),
    path("batches/<str:batch_id>/cancel", views.BatchCancelView.as_view(), name="batch-cancel"),
    # OpenRelay's own: a new batch of a finished batch's failed records.
    path("batches/<str:batch_id>/retry", views.BatchRetryView.as_view(), name="batch-retry"),
    # OpenRelay's own: the output or error lines of the records finished so far.
    path("batches/<str:batch_id>/results", views.BatchResultsView.as_view(), name="batch-results"),
]
