"""sweeps.task_name: the own name of the Task a sweep brings in its code, written by the worker

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-07 14:20:00
"""

import sqlalchemy as sa
from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("sweeps") as batch:
        batch.add_column(sa.Column("task_name", sa.String(200), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("sweeps") as batch:
        batch.drop_column("task_name")
