"""agent trajectories: each turn's text, each step's tool calls, the reward's reason

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-02 09:00:00
"""

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("turns") as t:
        t.add_column(sa.Column("text", sa.Text(), nullable=False, server_default=""))
    with op.batch_alter_table("steps") as t:
        t.add_column(sa.Column("calls_json", sa.Text(), nullable=True))
    with op.batch_alter_table("trajectories") as t:
        t.add_column(sa.Column("reward_reason", sa.Text(), nullable=True))
        t.add_column(sa.Column("reward_error", sa.Text(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("trajectories") as t:
        t.drop_column("reward_error")
        t.drop_column("reward_reason")
    with op.batch_alter_table("steps") as t:
        t.drop_column("calls_json")
    with op.batch_alter_table("turns") as t:
        t.drop_column("text")
