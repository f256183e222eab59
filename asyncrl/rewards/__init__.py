"""Rewards: answer extraction, built-in scorers (reasoning-gym, math-verify), user functions, batch scoring, DAPO's
overlong shaping and its dynamic-sampling rule."""
