// A failure the page shows where it happened, announced to screen readers.

export function Alert({ message, inline = false }: { message: string | null | undefined; inline?: boolean }) {
  if (!message) return null;
  return inline ? (
    <span class="error" role="alert">
      {message}
    </span>
  ) : (
    <p class="error" role="alert">
      {message}
    </p>
  );
}
