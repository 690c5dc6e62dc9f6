"""sweeps.extensions and sweeps.extension_samples: trials added to an ended sweep (`layerlab extend`)

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-07 14:45:00
"""

import sqlalchemy as sa
from alembic import op

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("sweeps") as batch:
        batch.add_column(sa.Column("extensions", sa.Integer(), nullable=False, server_default="0"))
        batch.add_column(sa.Column("extension_samples", sa.Integer(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("sweeps") as batch:
        batch.drop_column("extension_samples")
        batch.drop_column("extensions")
