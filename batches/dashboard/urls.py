from django.urls import path

from batches.dashboard import views as views

app_name = "dashboard"

# Included at "" by openrelay.urls: the dashboard's pages sit beside /v1/ and /admin/.
urlpatterns = [
    path("", views.home, name="home"),
    path("login", views.login, name="login"),
    path("logout", views.logout, name="logout"),
    path("batches/new", views.new_batch, name="new-batch"),
    path("batches/<str:batch_id>", views.batch_detail, name="batch"),
    path("batches/<str:batch_id>/cancel", views.batch_cancel, name="batch-cancel"),
    path("batches/<str:batch_id>/pause", views.batch_pause, name="batch-pause"),
    path("batches/<str:batch_id>/resume", views.batch_resume, name="batch-resume"),
    path("batches/<str:batch_id>/retry", views.batch_retry, name="batch-retry"),
    path("batches/<str:batch_id>/so_far.jsonl", views.batch_results_so_far, name="batch-results-so-far"),
    path("batches/<str:batch_id>/rejections.jsonl", views.batch_rejections, name="batch-rejections"),
    path("operator", views.operator_page, name="operator"),
    path("files", views.file_list, name="files"),
    path("files/<str:file_id>/download", views.file_download, name="file-download"),
    path("files/<str:file_id>/delete", views.file_delete, name="file-delete"),
]
