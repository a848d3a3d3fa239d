/// Metalink documents for tests of the reader and of the methods that take one.
public enum MetalinkFixture {
    /// A Metalink 4 document (RFC 5854) of these `<file>` elements.
    public static func document(_ files: String) -> String {
        #"<metalink xmlns="urn:ietf:params:xml:ns:metalink">"# + files + "</metalink>"
    }
}
