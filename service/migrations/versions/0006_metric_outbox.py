"""metric outbox: every reported step of a trial, written with the trial's progress, shipped to MLflow later

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-04 20:45:00
"""

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "metric_outbox",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column("sweep_id", sa.Integer(), sa.ForeignKey("sweeps.id", ondelete="CASCADE"), nullable=False),
        sa.Column("trial_id", sa.String(100), nullable=False),
        sa.Column("step", sa.Integer(), nullable=False),
        sa.Column("timestamp_ms", sa.BigInteger(), nullable=False),
        sa.Column("metrics", sa.JSON(), nullable=False),
        sa.Column("files", sa.JSON(), nullable=True),
        sa.Column("shipped", sa.Boolean(), nullable=False, server_default=sa.false()),
        sa.UniqueConstraint("sweep_id", "trial_id", "step", name="uq_outbox_sweep_trial_step"),
    )
    op.create_index("ix_outbox_unshipped", "metric_outbox", ["sweep_id", "shipped", "id"])
    with op.batch_alter_table("trials") as batch:
        batch.add_column(sa.Column("mlflow_status", sa.String(16), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("trials") as batch:
        batch.drop_column("mlflow_status")
    op.drop_index("ix_outbox_unshipped", table_name="metric_outbox")
    op.drop_table("metric_outbox")
