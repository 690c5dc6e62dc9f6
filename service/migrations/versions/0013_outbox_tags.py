"""metric_outbox.tags: run tags a trial's step carries to MLflow (PBT's exploit trail)

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-07 17:20:00
"""

import sqlalchemy as sa
from alembic import op

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("metric_outbox") as batch:
        batch.add_column(sa.Column("tags", sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("metric_outbox") as batch:
        batch.drop_column("tags")
