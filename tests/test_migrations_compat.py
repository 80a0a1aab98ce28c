"""Every migration leaves the schema usable by the previous release: the expand/contract rule a
rolling deploy needs (docs/guides/many-machines.md: migrate, then roll the workers one host at a time).

Between the migrate and the last host rolled, the previous release's processes insert rows into the
new schema without naming the columns it added. A NOT NULL column with only a Python-side default
(Django's `default=`: the column itself has none once AddField is done) refuses those inserts. So a
column an AddField brings is nullable or has a database default (`db_default`) in the schema the
migrations end with. The hosts tier runs the previous release's workers beside this one's
(tests/hosts/test_scenarios.py::test_rolling_deploy_old_and_new_workers_together).
"""

from django.apps import apps
from django.db import migrations, models
from django.db.migrations.loader import MigrationLoader

# The migrations made before the rule, applied by every release since: the releases that lacked their
# columns are more than one version old, so no rolling deploy runs them beside these.
BEFORE_THE_RULE = {
    "batches": "0012_batch_unbilled_usage",
    "billing": "0005_ledger_unbilled_usage",
    "core": "0010_organization_reuse_cache_ttl_s",
}
OURS = ("batches", "billing", "core", "files", "webhooks")


def added_columns():
    """(app, migration, model, field) of every AddField of our apps after the rule began."""
    loader = MigrationLoader(None, ignore_no_migrations=True)
    for (app, name), migration in sorted(loader.disk_migrations.items()):
        if app not in OURS or name <= BEFORE_THE_RULE.get(app, ""):
            continue
        for operation in migration.operations:
            if isinstance(operation, migrations.AddField):
                yield app, name, operation.model_name, operation.name


def test_every_added_column_takes_a_previous_releases_insert():
    state = MigrationLoader(None, ignore_no_migrations=True).project_state()
    refused = []
    for app, name, model, field_name in added_columns():
        field = state.models[(app, model)].fields.get(field_name)
        if field is None or field.many_to_many or field.null:
            continue  # removed since, a join table, or nullable: an insert without it works
        if field.db_default is models.NOT_PROVIDED:
            refused.append(f"{app}.{name}: {model}.{field_name} is NOT NULL without a db_default")
    assert refused == [], refused


def test_the_rule_sees_a_column_added_with_only_a_python_default():
    """The check itself: the columns 0013 and 0015 added were refused until 0016 gave them defaults."""
    added = {(model, field) for app, name, model, field in added_columns() if app == "batches"}
    assert {("record", "sent"), ("batch", "reuse"), ("record", "twins")} <= added
    assert apps.get_model("batches", "Record")._meta.get_field("sent").db_default is False
