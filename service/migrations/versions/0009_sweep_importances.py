"""sweeps.importances: each searched parameter's share of the final metric's variance (service.importance)

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-07 08:00:00
"""

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("sweeps") as batch:
        batch.add_column(sa.Column("importances", sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("sweeps") as batch:
        batch.drop_column("importances")
