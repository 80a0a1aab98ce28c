from django.urls import path

from batches.dashboard import consumers

websocket_urlpatterns = [
    path("ws/batches", consumers.OrganizationBatchesConsumer.as_asgi()),
    path("ws/operator", consumers.OperatorConsumer.as_asgi()),
    path("ws/batches/<str:batch_id>", consumers.BatchConsumer.as_asgi()),
]
