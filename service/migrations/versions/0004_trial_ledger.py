"""the trials table as the sweep's ledger: checkpoints, final results, reasons; closed MLflow runs

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-03 05:00:00
"""

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("trials") as batch:
        batch.add_column(sa.Column("checkpoint_path", sa.Text(), nullable=True))
        batch.add_column(sa.Column("checkpoint_iteration", sa.Integer(), nullable=False, server_default="0"))
        batch.add_column(sa.Column("final_result", sa.JSON(), nullable=True))
        batch.add_column(sa.Column("reason", sa.Text(), nullable=True))
    with op.batch_alter_table("sweeps") as batch:
        # Sweeps that ended before this column: their runs were closed by the worker that ended them, or
        # are left as they are.
        batch.add_column(sa.Column("mlflow_closed", sa.Boolean(), nullable=False, server_default=sa.true()))


def downgrade() -> None:
    with op.batch_alter_table("sweeps") as batch:
        batch.drop_column("mlflow_closed")
    with op.batch_alter_table("trials") as batch:
        batch.drop_column("reason")
        batch.drop_column("final_result")
        batch.drop_column("checkpoint_iteration")
        batch.drop_column("checkpoint_path")
