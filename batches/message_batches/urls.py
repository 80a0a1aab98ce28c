from django.urls import path

from batches.message_batches import views

# No trailing slashes: Anthropic's SDK requests /v1/messages/batches/{id}/cancel exactly.
urlpatterns = [
    path("messages/batches", views.MessageBatchListView.as_view(), name="message-batch-list"),
    path(
        "messages/batches/<str:message_batch_id>", views.MessageBatchDetailView.as_view(), name="message-batch-detail"
    ),
    path(
        "messages/batches/<str:message_batch_id>/cancel",
        views.MessageBatchCancelView.as_view(),
        name="message-batch-cancel",
    ),
    path(
        "messages/batches/<str:message_batch_id>/results",
        views.MessageBatchResultsView.as_view(),
        name="message-batch-results",
    ),
]
